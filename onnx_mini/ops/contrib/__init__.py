"""com.microsoft operators (onnxruntime's contrib operators), following onnxruntime's
ContribOperators documentation. Importing a module registers its kernels; registry.load_all_ops()
walks this package like every other family.

- transformer.py: Attention, MultiHeadAttention, GroupQueryAttention, RotaryEmbedding,
  SkipLayerNormalization, SkipSimplifiedLayerNormalization, EmbedLayerNormalization
- fused.py: Gelu, BiasGelu, FastGelu, QuickGelu, BiasAdd, BiasSplitGelu, FusedMatMul, FusedGemm,
  FusedConv, NhwcConv
- misc.py: Inverse, Trilu, GridSample, Range
- quantized_matmul.py, qlinear.py: the quantized operators (MatMulNBits, QLinear*, ...)
- text.py: Tokenizer, MurmurHash3; linalg.py: CDist, Solve (what skl2onnx writes for text vectorizers,
  feature hashing, nearest neighbours and Gaussian processes)

All are version 1 of the domain: the registry resolves a com.microsoft node to the newest registered
version not above the model's com.microsoft opset.
"""
