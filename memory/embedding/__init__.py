"""The embedding runtime: which embedder recall uses (embedder), the bundled ONNX model (local_model), and
the low-priority process that embeds documents off the request path (model_process).
"""
