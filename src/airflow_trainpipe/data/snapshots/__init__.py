"""Snapshots: a run's files frozen by content (the store), described by a manifest stored under its
digest, and a `files` source's partitions.
"""
