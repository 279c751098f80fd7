"""Where a training job runs and how it is followed: the runner (the one loop every caller uses),
torchrun children, jobs forked from a warm parent, pods and Indexed Jobs.
"""
