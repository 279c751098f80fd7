"""The examples' data and models behind `trainpipe make-data` and `trainpipe make-encoder`: synthetic
days of four kinds, Delta and Iceberg tables, a Feast repo, an encoder directory.
"""
