/*
 * tensorvm_aot.h: the small C runtime shim of tensorvm's ahead-of-time (AOT) flow.
 *
 * A model built with tensorvm.aot.build(mod, name="net") is plain C: a header tvmgen_net.h with
 * struct tvmgen_net_inputs / struct tvmgen_net_outputs (one void* per tensor), per-tensor size
 * macros, TVMGEN_NET_WORKSPACE_SIZE and
 *
 *     int32_t tvmgen_net_run(struct tvmgen_net_inputs*, struct tvmgen_net_outputs*[, void* workspace]);
 *
 * plus a descriptor `const tvaot_model_t tvmgen_net_model` (this file defines its type). An
 * application can call tvmgen_net_run directly, or use the helpers below to fill the structs from raw
 * buffers and check every buffer against the descriptor first. Nothing here allocates memory.
 */
#ifndef TENSORVM_AOT_H_
#define TENSORVM_AOT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The generated kernels are static functions in the model file; keeping them out of line lets each
 * one be optimized on its own (inlined into one large run function, their loops optimize worse). */
#if defined(__GNUC__) || defined(__clang__)
#define TVAOT_NOINLINE __attribute__((noinline))
#else
#define TVAOT_NOINLINE
#endif

/* Bumped when the layout of tvaot_model_t or tvaot_tensor_info_t changes. */
#define TVAOT_ABI_VERSION 1

/* Error codes returned by the run functions and by the helpers (0 is success). */
#define TVAOT_OK 0
#define TVAOT_ERR_NULL_ARGUMENT 1 /* a NULL model, struct, buffer or name */
#define TVAOT_ERR_NUM_TENSORS 2   /* the number of buffers differs from the descriptor */
#define TVAOT_ERR_SIZE 3          /* a buffer's size in bytes differs from the descriptor */
#define TVAOT_ERR_ALIGNMENT 4     /* a buffer is not aligned for its dtype, or the workspace is misaligned */
#define TVAOT_ERR_WORKSPACE 5     /* the external workspace is missing or too small */
#define TVAOT_ERR_OVERLAP 6       /* an output buffer overlaps an input or another output */
#define TVAOT_ERR_ABI 7           /* the descriptor was generated for another ABI version */
#define TVAOT_ERR_NOT_FOUND 8     /* no input/output of that name */

/* A kernel failed inside a run: bit 30 set, the step (kernel call) index above bit 12, the kernel's
 * own code (1..999: an entry check; 1001 division by zero; 1002 index out of range; 1003 out of
 * scratch memory) in the low 12 bits. */
#define TVAOT_KERNEL_ERROR(step, code) ((int32_t)(0x40000000 | (((int32_t)(step)) << 12) | ((code) & 0xfff)))
#define TVAOT_IS_KERNEL_ERROR(rc) (((rc) & 0x40000000) != 0)
#define TVAOT_KERNEL_ERROR_STEP(rc) ((((rc) & ~0x40000000)) >> 12)
#define TVAOT_KERNEL_ERROR_CODE(rc) ((rc) & 0xfff)

/* DLPack type codes, so that an application can map dtypes without parsing strings. */
#define TVAOT_DTYPE_INT 0
#define TVAOT_DTYPE_UINT 1
#define TVAOT_DTYPE_FLOAT 2
#define TVAOT_DTYPE_BOOL 6

/* One input or output tensor of a model. */
typedef struct {
  const char* name;      /* the member name in struct tvmgen_<model>_inputs / _outputs */
  const char* dtype;     /* "float32", "int64", "bool", ... */
  uint8_t dtype_code;    /* TVAOT_DTYPE_* */
  uint8_t dtype_bits;    /* bits per element (8 for bool) */
  int32_t ndim;          /* 0 for a scalar */
  const int64_t* shape;  /* ndim dims (NULL when ndim is 0) */
  size_t size_bytes;     /* bytes of the whole tensor (the TVMGEN_<MODEL>_<NAME>_SIZE macro) */
  size_t struct_offset;  /* offsetof the member in its struct */
} tvaot_tensor_info_t;

/* Runs the model on arrays of buffers (in descriptor order); workspace as for the run function. */
typedef int32_t (*tvaot_run_fn)(void* const* inputs, void* const* outputs, void* workspace);

/* The model descriptor tvmgen_<model>_model. */
typedef struct {
  uint32_t abi_version;      /* TVAOT_ABI_VERSION of the generator */
  const char* name;          /* the model name given to tensorvm.aot.build */
  uint32_t num_inputs;
  uint32_t num_outputs;
  const tvaot_tensor_info_t* inputs;   /* num_inputs entries (NULL when none) */
  const tvaot_tensor_info_t* outputs;  /* num_outputs entries */
  size_t workspace_size;      /* bytes of the planned workspace (intermediates and kernel scratch) */
  size_t workspace_alignment; /* required alignment of the workspace */
  int32_t workspace_external; /* 1: the application passes the workspace; 0: it is a static buffer */
  int32_t reentrant;          /* 1: concurrent runs are safe with distinct buffers and workspaces */
  size_t constants_size;      /* bytes of the linked parameters */
  tvaot_run_fn run;           /* generic entry: fills the structs and calls tvmgen_<model>_run */
} tvaot_model_t;

/* A short English description of an error code (never NULL). */
const char* tvaot_error_string(int32_t code);

/* Number of elements of a tensor (1 for a scalar). */
size_t tvaot_num_elements(const tvaot_tensor_info_t* info);

/* Index of the input/output called `name`, or -1. */
int32_t tvaot_find_input(const tvaot_model_t* model, const char* name);
int32_t tvaot_find_output(const tvaot_model_t* model, const char* name);

/* TVAOT_OK when the descriptor matches this shim's ABI. */
int32_t tvaot_check_model(const tvaot_model_t* model);

/* Check one buffer against a tensor's description: non-NULL, `size` bytes, aligned for its dtype. */
int32_t tvaot_check_buffer(const tvaot_tensor_info_t* info, const void* data, size_t size);

/* Fill struct tvmgen_<model>_inputs (or _outputs) from `count` raw buffers in descriptor order,
 * checking each against the descriptor (`sizes` may be NULL to skip the size check). */
int32_t tvaot_fill_inputs(const tvaot_model_t* model, void* inputs_struct, void* const* buffers,
                          const size_t* sizes, uint32_t count);
int32_t tvaot_fill_outputs(const tvaot_model_t* model, void* outputs_struct, void* const* buffers,
                           const size_t* sizes, uint32_t count);

/* Check everything (counts, sizes, alignment, overlap, workspace), then run the model.
 * `workspace`/`workspace_size` are used only by models built with an external workspace. */
int32_t tvaot_run(const tvaot_model_t* model, void* const* inputs, const size_t* input_sizes,
                  uint32_t num_inputs, void* const* outputs, const size_t* output_sizes, uint32_t num_outputs,
                  void* workspace, size_t workspace_size);

#ifdef __cplusplus
}
#endif

#endif /* TENSORVM_AOT_H_ */
