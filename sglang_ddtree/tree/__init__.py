"""The tree algorithm without SGLang: verify tensors from an expansion, the executable specifications (plain PyTorch
references the kernels and the server are tested against) and the cost-aware width policy of ``--budget auto``
with its measured step times."""
