"""A model package without models: 0.5.23's model registry is imported with this package
as its external one (`cpu/model_registry.py`), which defers SGLang's own ~200 model
modules until something needs them all."""
