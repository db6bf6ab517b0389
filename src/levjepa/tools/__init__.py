"""Tools over trained encoders and configs: FLOPs accounting (``flops.py``) and PCA / similarity maps of
patch features (``visualize.py``); the ``levjepa flops | visualize`` commands print and write them."""
