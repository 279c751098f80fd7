"""Notifiers: messages about a pipeline's runs (parse-time light; senders are imported on send)."""
