"""Prepare-time graph optimisation, on the plain Graph objects (no protobuf), before resolution.

`optimize_graph(graph, opsets, functions)` returns an equivalent graph; build_plan calls it when
optimize=True. The passes (each in its own module) rewrite only ops of the default domain at the
versions whose semantics they know, never touch a value that is a graph output, read by another node
or captured by a subgraph, and keep results within the official tolerances:

- patterns.py: LayerNormalization, Gelu (Erf and Tanh forms), SiLU and softmax(QK'/sqrt(d) + mask)V
  written as elementary ops become one kernel each; so does quantize_dynamic's MatMulInteger -> Cast ->
  Mul(scale) -> Add(bias), bit for bit, with a Gelu that alone reads it, and a one-hot (Equal with a
  constant row of distinct values, Cast) times a constant matrix, bit for bit, as a gather of its rows;
- shapes.py: Shape of a value whose shape is fixed before run becomes a constant, so the
  Shape -> Gather -> Concat -> Reshape chains after it fold;
- identities.py: Identity, inference Dropout and Reshape to the same shape bypassed (readers read
  the input);
- fold_batchnorm.py: a per-channel Mul / Add after an inference BatchNormalization folded into its
  scale and bias; the BatchNormalization then folded into a preceding Conv / ConvTranspose / Gemm /
  MatMul with constant weights (new weights and bias initializers); a per-channel Mul / Add after a Conv
  (right after it, or after layout steps that keep its channels: Squeeze, Unsqueeze, Slice) folded into
  its weights and bias alike;
- bias_through.py: a Conv's bias carried into the 1x1 Conv that alone reads its output;
- relu_concat.py: a Relu after a Concat applied to the Concat's inputs that can be negative only
  (then fused into their convolutions);
- scan_hoist.py: a Scan body's MatMul of a scan input (read by it alone) by a matrix the body does
  not compute becomes one MatMul over the whole scan input before the loop, its rows the scan input;
  a body output made by an Identity names the Identity's input instead;
- fuse.py: MatMul + Add bias (+ a second Add), Conv + Add / Sum residual, and Conv / Gemm / MatMul / BatchNormalization
  + activation (Relu, Clip, LeakyRelu, Sigmoid, HardSigmoid, HardSwish, Tanh, SiLU), one step each;
- channel_shuffle.py: ShuffleNet's Reshape -> Transpose -> Reshape channel shuffle after a grouped
  1x1 Conv written by that Conv in shuffled order;
- qdq_lut.py: DequantizeLinear -> elementwise ops with constant operands -> QuantizeLinear on 8-bit
  codes with per-tensor scales becomes one 256-entry lookup table made by the nodes' own kernels;
- qdq_pair.py: QuantizeLinear read back by a DequantizeLinear with the same constant per-tensor
  parameters becomes one QuantizeDequantize step (float32 in, float32 out, no codes);
- channels_last.py: regions of 2-D Convs (one depthwise, two at least) joined by elementwise steps run
  channels-last (fused ConvNHWC), transposed once where values enter and leave the region;
- requantize.py: a QuantizeDequantize / LookupTable (floats in and out) alone reading a Conv's or
  ConvNHWC's output run in place in that Conv's epilogue, part by part;
- dead_code.py: nodes and initializers nothing reads any more.

The rewritten nodes use the private domain FUSED_DOMAIN (their kernels: ops/fused.py), which
optimize_graph's caller adds to the opsets (`with_fused_domain`).
"""
from __future__ import annotations

import warnings

from ..graph import Graph
from ._context import FUSED_DOMAIN, Context
from .dead_code import eliminate_dead_nodes
from .fold_batchnorm import fold_affine_into_batchnorm, fold_affine_into_conv, fold_batchnorm
from .bias_through import fold_bias_through
from .channel_shuffle import fold_channel_shuffle
from .channels_last import run_channels_last
from .fuse import fuse_activations, fuse_affine_after_activation, fuse_conv_add, fuse_matmul_add
from .identities import eliminate_identities
from .patterns import fuse_patterns
from .qdq_lut import fuse_qdq_lookup
from .qdq_pair import fuse_qdq_pairs
from .relu_concat import push_relu_into_concat
from .requantize import fuse_requantize
from .scan_hoist import hoist_scan_projections
from .shapes import fold_static_shapes

__all__ = ["FUSED_DOMAIN", "OptimizationWarning", "optimize_graph", "with_fused_domain", "PASSES"]

PASSES = ("dead_code", "identities", "shapes", "patterns", "fold_batchnorm", "scan_hoist", "fuse", "qdq_lut", "qdq_pair",
          "channels_last", "requantize")


def with_fused_domain(opsets: dict[str, int]) -> dict[str, int]:
    return opsets if FUSED_DOMAIN in opsets else {**opsets, FUSED_DOMAIN: 1}


class OptimizationWarning(RuntimeWarning):
    """A pass failed on this graph (a bug in the pass): the graph runs as written instead."""


def optimize_graph(graph: Graph, opsets: dict[str, int], functions=None, *, outer_scope=(),
                   static_inputs: bool = False, passes=None) -> Graph:
    """The graph with the passes applied (the input graph is not modified).
    static_inputs: the graph inputs' declared fixed dims are checked at run (a top-level graph).
    passes: names from PASSES to run (default: the module's PASSES)."""
    if not graph.nodes:
        return graph
    try:
        return _optimize(graph, opsets, functions, outer_scope, static_inputs, PASSES if passes is None else passes)
    except Exception as e:      # never let an optimiser bug stop a model that runs as written
        warnings.warn(f"graph optimisation of {graph.name!r} failed ({type(e).__name__}: {e}); the graph runs "
                      "as written", OptimizationWarning, stacklevel=2)
        return graph


def _optimize(graph, opsets, functions, outer_scope, static_inputs, passes) -> Graph:
    ctx = Context(graph, opsets, functions, outer_scope, static_inputs)
    if "dead_code" in passes:
        eliminate_dead_nodes(ctx)
    if "identities" in passes:
        eliminate_identities(ctx)
    if "shapes" in passes:
        fold_static_shapes(ctx)
    if "patterns" in passes:
        fuse_patterns(ctx)
    if "qdq_lut" in passes:
        fuse_qdq_lookup(ctx)
    if "qdq_pair" in passes:       # after qdq_lut: its chains take their pairs first
        fuse_qdq_pairs(ctx)
    if "fold_batchnorm" in passes:
        fold_affine_into_batchnorm(ctx)
        fold_affine_into_conv(ctx)      # (first: a Conv's bias written as an Add before its BN)
        fold_batchnorm(ctx)
        fold_affine_into_conv(ctx)
        fold_bias_through(ctx)
    if "scan_hoist" in passes:
        hoist_scan_projections(ctx)
    if "fuse" in passes:
        fuse_matmul_add(ctx)
        fuse_conv_add(ctx)
        push_relu_into_concat(ctx)
        fuse_activations(ctx)
        fuse_affine_after_activation(ctx)
        fold_channel_shuffle(ctx)
    if "channels_last" in passes:  # after fuse and the qdq passes: it takes their fused steps as they are
        run_channels_last(ctx)
    if "requantize" in passes:     # last: it takes the Convs the passes above made
        fuse_requantize(ctx)
    if "dead_code" in passes:
        eliminate_dead_nodes(ctx)
    return ctx.graph_result()
