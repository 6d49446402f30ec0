/* isa.c: the kernels for one instruction set, as one translation unit and one ds4k_ops table.
 *
 * qgemv.py compiles this file three times: -DDS4K_ISA=0 (no vector flags), 1 (-mavx2 -mfma
 * -mf16c) and 2 (adding -mavx512f -mavx512bw -mavx512vl), each defining its own table
 * (DS4K_OPS_NAME). dispatch.c chooses one per call, so one library runs on any x86-64
 * CPU at the widest vector width it has, and tests can force each variant in turn.
 */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ds4k.h"
#include "simd.h"
#include "vec.h"

#include "dequant.c"
#include "qgemv.c"
#include "qgemm.c"
#include "attn.c"
#include "llama_step.c"
#include "rows.c"
#include "chunk.c"
#include "finite.c"
#include "qdot.c"

#ifndef DS4K_OPS_NAME
#define DS4K_OPS_NAME ds4k_ops_scalar
#endif

const ds4k_ops DS4K_OPS_NAME = {gemv, gemm, dequant, llama_step, llama_workspace, attn, glu, rms_norm_rows, qk_rope,
                                 llama_layer, llama_layer_workspace, all_finite, qdot_gemm,
                                 qdot_quantize};
