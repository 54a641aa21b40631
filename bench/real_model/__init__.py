"""Accuracy of the KV cache formats on a real trained model: python -m bench.real_model (see __main__.py)."""
