"""The training job's data: the frozen snapshot read in blocks, the transforms fitted once per
run, and the epoch's rows as one stream every rank reads its share of.

reader (files checked against the manifest, the holdout split), prepare (the fit stage and the
block index), fitting + sketch + transform (the streamed fit and the fitted transform's JSON),
blocks, stream and sampler (the epoch's rows, resumable, the same on every world size).
"""
