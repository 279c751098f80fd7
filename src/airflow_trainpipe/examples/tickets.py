"""Support tickets as people write them: a subject and a body whose wording depends on the team
that should handle the ticket, with what makes routing on text hard.

A ticket's sentences mostly come from its team's phrases, but also from the generic ones every
ticket has ("thanks in advance", an order number) and, one sentence in five, from another team's
(a billing ticket that mentions the app it paid in); words are shared across teams ("account",
"card", "payment" occur in several), and about one word in 25 has a typo (a swapped, dropped or
doubled letter). The subject is one short phrase, sometimes a generic one ("urgent", "help").
Deterministic for a seed: the same day gives the same text.
"""

from __future__ import annotations

import numpy as np

SUBJECTS = {
    "account": [
        "cannot log in",
        "password reset not working",
        "locked out of my account",
        "change my email address",
        "verification code never arrives",
        "update phone number on profile",
        "close my account",
        "forgot my username",
        "two factor authentication problem",
        "account suspended without reason",
    ],
    "billing": [
        "charged twice",
        "refund request",
        "invoice is wrong",
        "unexpected fee on statement",
        "payment declined",
        "still billed after cancelling",
        "wrong amount charged",
        "card payment failed",
        "subscription price changed",
        "need a copy of my invoice",
    ],
    "shipping": [
        "package not delivered",
        "tracking number not updating",
        "wrong delivery address",
        "parcel arrived damaged",
        "delivery is late",
        "new card has not arrived",
        "courier left package outside",
        "missing item in order",
        "change delivery date",
        "return label not received",
    ],
    "technical": [
        "app keeps crashing",
        "error message when uploading",
        "website does not load",
        "sync fails on phone",
        "bug after the latest update",
        "cannot upload documents",
        "screen freezes on checkout",
        "notifications stopped",
        "page shows error 500",
        "login button does nothing",
    ],
}
GENERIC_SUBJECTS = ["urgent", "help needed", "question", "problem with my order", "please help", "issue"]

SENTENCES = {
    "account": [
        "I tried to reset my password three times but the link in the email expired each time.",
        "The login page keeps saying my credentials are wrong even though I typed them carefully.",
        "I never received the verification code by sms so I cannot sign in.",
        "Please update the email address on my profile to the new one below.",
        "My account was locked after too many attempts and I need access today.",
        "I would like to change the name shown on my account.",
        "The two factor code arrives after it has already expired.",
        "I forgot which username I registered with and the recovery form does not help.",
        "Please close my account and delete my personal data.",
        "Someone may have accessed my account because my password no longer works.",
    ],
    "billing": [
        "I was charged twice for the same order according to my bank statement.",
        "The invoice shows a service fee that I never agreed to.",
        "Please refund the duplicate payment to my card.",
        "My card was declined although there is enough balance on it.",
        "I cancelled my subscription last month but I was billed again.",
        "The amount charged does not match the price on the website.",
        "Can you send me a corrected invoice with my company details.",
        "There is a pending charge that has not been released for two weeks.",
        "The refund you promised has still not reached my account.",
        "Why did the monthly price go up without any notice.",
    ],
    "shipping": [
        "My package was supposed to arrive on monday and it is still not here.",
        "The tracking number has shown the same status for five days.",
        "The parcel was sent to my old address instead of the new one.",
        "The box arrived crushed and the item inside is damaged.",
        "The courier marked the order as delivered but nothing was left at my door.",
        "My replacement card has not arrived in the post yet.",
        "One item from my order is missing from the delivery.",
        "Can I change the delivery date because I will be away.",
        "I have not received the return label for the broken item.",
        "The delivery driver could not find the building and took the parcel back.",
    ],
    "technical": [
        "The app crashes every time I open the settings screen.",
        "I get an error message when I try to upload a document.",
        "The website does not load at all in my browser.",
        "Since the latest update the data no longer syncs between my phone and laptop.",
        "The checkout screen freezes and I have to restart the app.",
        "Push notifications stopped working after I reinstalled the app.",
        "The page shows error 500 when I click on my orders.",
        "Nothing happens when I press the login button on android.",
        "The pdf export produces an empty file.",
        "The app is extremely slow and sometimes shows a blank screen.",
    ],
}
GENERIC = [
    "Thanks in advance for your help.",
    "This is the second time I am writing about this.",
    "Please get back to me as soon as possible.",
    "I have been a customer for many years.",
    "My order number is {n}.",
    "Kind regards.",
    "I tried calling but nobody answered.",
    "Let me know if you need anything else from me.",
    "This is really frustrating.",
    "I am using the account on my phone and my laptop.",
]
MISLEADING_SHARE = 0.2
TYPO_RATE = 0.04


def ticket_texts(teams: np.ndarray, rng: np.random.Generator) -> tuple[list[str], list[str]]:
    """(subjects, bodies) of tickets for the given teams."""
    names = list(SUBJECTS)
    subjects, bodies = [], []
    for team in teams.tolist():
        if rng.random() < 0.15:
            subject = GENERIC_SUBJECTS[rng.integers(len(GENERIC_SUBJECTS))]
        else:
            subject = SUBJECTS[team][rng.integers(len(SUBJECTS[team]))]
        sentences = []
        for _ in range(int(rng.integers(1, 5))):
            draw = rng.random()
            if draw < MISLEADING_SHARE:
                other = names[rng.integers(len(names))]
                sentences.append(SENTENCES[other][rng.integers(len(SENTENCES[other]))])
            elif draw < 0.65:
                sentences.append(SENTENCES[team][rng.integers(len(SENTENCES[team]))])
            else:
                sentences.append(
                    GENERIC[rng.integers(len(GENERIC))].format(n=int(rng.integers(10_000, 99_999)))
                )
        subjects.append(_typos(subject.capitalize(), rng))
        bodies.append(_typos(" ".join(sentences), rng))
    return subjects, bodies


def _typos(text: str, rng: np.random.Generator) -> str:
    words = text.split(" ")
    for i, word in enumerate(words):
        if len(word) > 3 and rng.random() < TYPO_RATE:
            at = int(rng.integers(1, len(word) - 1))
            kind = rng.integers(3)
            if kind == 0:  # swapped letters
                word = word[: at - 1] + word[at] + word[at - 1] + word[at + 1 :]
            elif kind == 1:  # a dropped letter
                word = word[:at] + word[at + 1 :]
            else:  # a doubled letter
                word = word[:at] + word[at] + word[at:]
            words[i] = word
    return " ".join(words)
