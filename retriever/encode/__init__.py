"""Encoding: text -> a frozen transformer -> pooled sentence vectors (`encoder.Encoder`), with its tokenizing, its
pooling, the models it knows, its forward pass on PyTorch or ONNX Runtime, and the device it runs on."""
