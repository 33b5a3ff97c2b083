/*
 * tensorvm_aot.c: helpers for applications running tensorvm AOT models (see tensorvm_aot.h).
 * Checks buffers against a model descriptor and fills the generated input/output structs. No
 * allocation, no global state; C99.
 */
#include "tensorvm_aot.h"

#include <string.h>

const char* tvaot_error_string(int32_t code) {
  if (TVAOT_IS_KERNEL_ERROR(code)) {
    switch (TVAOT_KERNEL_ERROR_CODE(code)) {
      case 1001: return "a kernel failed: integer division by zero";
      case 1002: return "a kernel failed: an index is out of range";
      case 1003: return "a kernel failed: out of scratch memory";
      default: return "a kernel failed an entry check";
    }
  }
  switch (code) {
    case TVAOT_OK: return "success";
    case TVAOT_ERR_NULL_ARGUMENT: return "a NULL model, struct, buffer or name";
    case TVAOT_ERR_NUM_TENSORS: return "the number of buffers differs from the model descriptor";
    case TVAOT_ERR_SIZE: return "a buffer size differs from the model descriptor";
    case TVAOT_ERR_ALIGNMENT: return "a buffer or the workspace is not aligned";
    case TVAOT_ERR_WORKSPACE: return "the workspace is missing or too small";
    case TVAOT_ERR_OVERLAP: return "an output buffer overlaps another buffer";
    case TVAOT_ERR_ABI: return "the model descriptor was generated for another ABI version";
    case TVAOT_ERR_NOT_FOUND: return "no tensor of that name";
    default: return "unknown error";
  }
}

size_t tvaot_num_elements(const tvaot_tensor_info_t* info) {
  size_t n = 1;
  int32_t i;
  if (info == NULL) return 0;
  for (i = 0; i < info->ndim; ++i) n *= (size_t)info->shape[i];
  return n;
}

static int32_t find(const tvaot_tensor_info_t* infos, uint32_t count, const char* name) {
  uint32_t i;
  if (infos == NULL || name == NULL) return -1;
  for (i = 0; i < count; ++i) {
    if (strcmp(infos[i].name, name) == 0) return (int32_t)i;
  }
  return -1;
}

int32_t tvaot_find_input(const tvaot_model_t* model, const char* name) {
  return model == NULL ? -1 : find(model->inputs, model->num_inputs, name);
}

int32_t tvaot_find_output(const tvaot_model_t* model, const char* name) {
  return model == NULL ? -1 : find(model->outputs, model->num_outputs, name);
}

int32_t tvaot_check_model(const tvaot_model_t* model) {
  if (model == NULL) return TVAOT_ERR_NULL_ARGUMENT;
  if (model->abi_version != TVAOT_ABI_VERSION) return TVAOT_ERR_ABI;
  if (model->run == NULL) return TVAOT_ERR_NULL_ARGUMENT;
  return TVAOT_OK;
}

int32_t tvaot_check_buffer(const tvaot_tensor_info_t* info, const void* data, size_t size) {
  size_t item = 1;
  if (info == NULL || data == NULL) return TVAOT_ERR_NULL_ARGUMENT;
  if (size != info->size_bytes) return TVAOT_ERR_SIZE;
  if (info->dtype_bits > 8) item = info->dtype_bits / 8u;
  if (((uintptr_t)data) % item != 0) return TVAOT_ERR_ALIGNMENT;
  return TVAOT_OK;
}

static int32_t fill(const tvaot_tensor_info_t* infos, uint32_t expected, void* dest, void* const* buffers,
                    const size_t* sizes, uint32_t count) {
  uint32_t i;
  if (dest == NULL || (count > 0 && buffers == NULL)) return TVAOT_ERR_NULL_ARGUMENT;
  if (count != expected) return TVAOT_ERR_NUM_TENSORS;
  for (i = 0; i < count; ++i) {
    int32_t rc = tvaot_check_buffer(&infos[i], buffers[i], sizes != NULL ? sizes[i] : infos[i].size_bytes);
    if (rc != TVAOT_OK) return rc;
  }
  for (i = 0; i < count; ++i) {
    void** slot = (void**)((char*)dest + infos[i].struct_offset);
    *slot = buffers[i];
  }
  return TVAOT_OK;
}

int32_t tvaot_fill_inputs(const tvaot_model_t* model, void* inputs_struct, void* const* buffers,
                          const size_t* sizes, uint32_t count) {
  int32_t rc = tvaot_check_model(model);
  if (rc != TVAOT_OK) return rc;
  return fill(model->inputs, model->num_inputs, inputs_struct, buffers, sizes, count);
}

int32_t tvaot_fill_outputs(const tvaot_model_t* model, void* outputs_struct, void* const* buffers,
                           const size_t* sizes, uint32_t count) {
  int32_t rc = tvaot_check_model(model);
  if (rc != TVAOT_OK) return rc;
  return fill(model->outputs, model->num_outputs, outputs_struct, buffers, sizes, count);
}

static int overlaps(const void* a, size_t a_size, const void* b, size_t b_size) {
  uintptr_t a0 = (uintptr_t)a, b0 = (uintptr_t)b;
  if (a_size == 0 || b_size == 0) return 0;
  return a0 < b0 + b_size && b0 < a0 + a_size;
}

int32_t tvaot_run(const tvaot_model_t* model, void* const* inputs, const size_t* input_sizes,
                  uint32_t num_inputs, void* const* outputs, const size_t* output_sizes, uint32_t num_outputs,
                  void* workspace, size_t workspace_size) {
  uint32_t i, j;
  int32_t rc = tvaot_check_model(model);
  if (rc != TVAOT_OK) return rc;
  if ((num_inputs > 0 && inputs == NULL) || (num_outputs > 0 && outputs == NULL)) return TVAOT_ERR_NULL_ARGUMENT;
  if (num_inputs != model->num_inputs || num_outputs != model->num_outputs) return TVAOT_ERR_NUM_TENSORS;
  for (i = 0; i < num_inputs; ++i) {
    rc = tvaot_check_buffer(&model->inputs[i], inputs[i],
                            input_sizes != NULL ? input_sizes[i] : model->inputs[i].size_bytes);
    if (rc != TVAOT_OK) return rc;
  }
  for (i = 0; i < num_outputs; ++i) {
    const tvaot_tensor_info_t* info = &model->outputs[i];
    rc = tvaot_check_buffer(info, outputs[i], output_sizes != NULL ? output_sizes[i] : info->size_bytes);
    if (rc != TVAOT_OK) return rc;
    for (j = 0; j < num_inputs; ++j) {
      if (overlaps(outputs[i], info->size_bytes, inputs[j], model->inputs[j].size_bytes)) return TVAOT_ERR_OVERLAP;
    }
    for (j = 0; j < i; ++j) {
      if (overlaps(outputs[i], info->size_bytes, outputs[j], model->outputs[j].size_bytes)) {
        return TVAOT_ERR_OVERLAP;
      }
    }
  }
  if (model->workspace_external && model->workspace_size > 0) {
    if (workspace == NULL || workspace_size < model->workspace_size) return TVAOT_ERR_WORKSPACE;
    if (((uintptr_t)workspace) % model->workspace_alignment != 0) return TVAOT_ERR_ALIGNMENT;
  }
  return model->run(inputs, outputs, workspace);
}
