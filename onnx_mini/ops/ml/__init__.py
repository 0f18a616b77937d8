"""ai.onnx.ml model operators (onnx/defs/traditionalml): tree ensembles, SVMs, linear models.

registry.load_all_ops walks this package, so a new module here is picked up without an import."""
