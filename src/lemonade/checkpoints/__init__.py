"""Checkpoint strings ("owner/repo:variant") and where their files live in the Hugging Face cache.

Shared ground for `catalog/` (is a model downloaded, which files does it load) and `downloads/`
(what to fetch, where to put it), so that neither has to import the other.
"""
