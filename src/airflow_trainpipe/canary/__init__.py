"""Canary release: the gate's winner serves a growing share of live traffic beside the champion.

`router` (the local weighted router, a process of its own), `local` (the local backend: two
`mlflow models serve` and the router), `checks` (a step's figures from the request log, and the
verdict). Nothing here is imported while DAGs parse.
"""
