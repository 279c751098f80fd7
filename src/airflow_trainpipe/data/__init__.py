"""The data path, bottom to top: the run's window, snapshots, sources, validation, the feature store,
and freeze (the one coordinator that turns a source into the run's frozen snapshot).
"""
