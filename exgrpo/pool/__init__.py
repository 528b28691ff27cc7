"""The pool inspector: look inside a saved experience pool (docs/pool_inspector.md).

``python -m exgrpo.pool inspect|export|show`` (:mod:`exgrpo.pool.cli`). A pool is read with the loader's own
checks (:func:`exgrpo.experience.persistence.open_experience`), its token file streamed batch by batch. Like the
rest of ``exgrpo/`` it never imports verl or ray; matplotlib and transformers are imported only when a figure or a
tokenizer is asked for.
"""
