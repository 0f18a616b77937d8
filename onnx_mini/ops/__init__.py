"""Kernels, one module per ONNX operator family (mirroring onnx/defs). Importing a module registers
its kernels; registry.load_all_ops() imports them all."""
