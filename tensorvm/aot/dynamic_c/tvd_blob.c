/* Loading a library's constants from a params blob (tensorvm AOT, dynamic=True, constants="blob"; the format
   is written by tensorvm/aot/dynamic.py and described in docs/aot_dynamic.md). This text follows tvd_api.c in
   such a library only. The blob is untrusted input: every field is checked against the file's length and
   against what the library expects (its program hash, its constants' count and byte sizes), and a checksum
   covers the table and the data, so a truncated, corrupted or foreign file is an error, never a crash or a
   read past its end. All integers in the file are little-endian, read byte by byte.

   layout: 0 magic "TVDPARAM" | 8 u32 version (1) | 12 u32 count | 16 u64 file size | 24 u64 sum | 32 u64
   weighted sum | 40 32 bytes: the program hash | 72 u64 zero | 80 count x {u64 offset, u64 nbytes} | data,
   each constant at a multiple of 64 bytes, zero padding, the file a multiple of 64 bytes. The sums are over
   the bytes from 80 to the end as u64 words w_i (i from 0): sum of w_i and of (i + 1) * w_i, modulo 2^64. */
#include <stdio.h>

#define TVD_BLOB_HEADER 80
#define TVD_BLOB_VERSION 1

static uint64_t tvd_le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

static uint32_t tvd_le32(const unsigned char* p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Checks the blob in block (size bytes, 64-aligned) against this library; TVD_OK or TVD_ERR_FORMAT with why. */
static int32_t tvd_blob_check(tvd_model* m, const unsigned char* b, uint64_t size, const char* what) {
  if (size < TVD_BLOB_HEADER)
    return tvd_fail(m, TVD_ERR_FORMAT, "%s: a params blob of %llu bytes, fewer than its %d-byte header (truncated?)",
                    what, (unsigned long long)size, TVD_BLOB_HEADER);
  if (memcmp(b, "TVDPARAM", 8) != 0)
    return tvd_fail(m, TVD_ERR_FORMAT, "%s: not a params blob (expected the magic TVDPARAM)", what);
  const uint32_t version = tvd_le32(b + 8);
  if (version != TVD_BLOB_VERSION)
    return tvd_fail(m, TVD_ERR_FORMAT, "%s: params blob version %u, this library reads version %d", what, version,
                    TVD_BLOB_VERSION);
  const uint64_t stated = tvd_le64(b + 16);
  if (stated != size)
    return tvd_fail(m, TVD_ERR_FORMAT, "%s: the params blob says it has %llu bytes, got %llu (truncated or padded)",
                    what, (unsigned long long)stated, (unsigned long long)size);
  if (memcmp(b + 40, tvd_program_hash, 32) != 0)
    return tvd_fail(m, TVD_ERR_FORMAT, "%s: the params blob belongs to another program (its hash differs from "
                    "this library's)", what);
  if (tvd_le64(b + 72) != 0) return tvd_fail(m, TVD_ERR_FORMAT, "%s: the params blob's reserved field is not 0", what);
  const uint64_t count = tvd_le32(b + 12), expected = (uint64_t)tvd_num_constants();
  if (count != expected)
    return tvd_fail(m, TVD_ERR_FORMAT, "%s: the params blob holds %llu constants, this library has %llu", what,
                    (unsigned long long)count, (unsigned long long)expected);
  const uint64_t table_end = TVD_BLOB_HEADER + 16 * count; /* (count <= this library's count: no overflow) */
  if (size % 64 != 0 || table_end > size)
    return tvd_fail(m, TVD_ERR_FORMAT, "%s: a params blob of %llu bytes cannot hold its table of %llu constants "
                    "(or is not a multiple of 64 bytes)", what, (unsigned long long)size, (unsigned long long)count);
  uint64_t sum = 0, weighted = 0;
  for (uint64_t i = 0, at = TVD_BLOB_HEADER; at < size; ++i, at += 8) {
    const uint64_t w = tvd_le64(b + at);
    sum += w;
    weighted += (i + 1) * w;
  }
  if (sum != tvd_le64(b + 24) || weighted != tvd_le64(b + 32))
    return tvd_fail(m, TVD_ERR_FORMAT, "%s: the params blob's checksum does not match its contents (corrupted)", what);
  for (uint64_t k = 0; k < count; ++k) {
    const uint64_t offset = tvd_le64(b + TVD_BLOB_HEADER + 16 * k), nbytes = tvd_le64(b + TVD_BLOB_HEADER + 16 * k + 8);
    const uint64_t want = (uint64_t)tvd_constant_bytes(tvd_constant_info((int64_t)k));
    if (nbytes != want)
      return tvd_fail(m, TVD_ERR_FORMAT, "%s: constant %llu of the params blob has %llu bytes, this library expects "
                      "%llu", what, (unsigned long long)k, (unsigned long long)nbytes, (unsigned long long)want);
    if (offset % 64 != 0 || offset < table_end || offset > size || nbytes > size - offset)
      return tvd_fail(m, TVD_ERR_FORMAT, "%s: constant %llu of the params blob lies at bytes %llu..%llu, outside its "
                      "data (%llu..%llu) or not 64-byte aligned", what, (unsigned long long)k,
                      (unsigned long long)offset, (unsigned long long)(offset + nbytes), (unsigned long long)table_end,
                      (unsigned long long)size);
  }
  return TVD_OK;
}

/* Takes block (the blob, size bytes, from the pool's allocator): checked, then the constants view it. */
static int32_t tvd_blob_adopt(tvd_model* m, unsigned char* block, uint64_t size, const char* what) {
  tv_pool* pool = m->pool;
  int32_t rc = tvd_blob_check(m, block, size, what);
  for (int64_t k = 0; rc == TVD_OK && k < tvd_num_constants(); ++k) {
    const unsigned char* data = block + tvd_le64(block + TVD_BLOB_HEADER + 16 * k);
    if (tvd_constant_object(m, tvd_constant_info(k), data, &m->constants[k]) != TVD_OK)
      rc = tvd_fail(m, TVD_ERR_MEMORY, "%s: out of memory", what);
    else
      m->nconstants = k + 1;
  }
  if (rc != TVD_OK) {
    for (int64_t k = 0; k < m->nconstants; ++k) tv_decref(m->constants[k]);
    m->nconstants = 0;
    pool->allocator.free(pool->allocator.user, block);
    return rc;
  }
  m->blob = block;
  m->ctx.nconstants = m->nconstants;
  return TVD_OK;
}

static int32_t tvd_blob_ready(tvd_model* m, const char* what) {
  if (m->blob != NULL) return tvd_fail(m, TVD_ERR_ARGUMENT, "%s: the params are loaded already", what);
  return TVD_OK;
}

int32_t TVD_FN(load_params)(tvd_model* m, const void* data, size_t size) {
  if (m == NULL) return TVD_ERR_ARGUMENT;
  tvd_scope scope = tvd_enter(m);
  int32_t rc = tvd_blob_ready(m, "load_params");
  if (rc == TVD_OK && data == NULL) rc = tvd_fail(m, TVD_ERR_ARGUMENT, "load_params: data is NULL");
  unsigned char* block = NULL;
  if (rc == TVD_OK && (block = (unsigned char*)m->pool->allocator.alloc(m->pool->allocator.user, size ? size : 1, 64)) ==
                          NULL)
    rc = tvd_fail(m, TVD_ERR_MEMORY, "load_params: out of memory (%zu bytes)", size);
  if (rc == TVD_OK) {
    if (size > 0) memcpy(block, data, size);
    rc = tvd_blob_adopt(m, block, size, "load_params");
  }
  tvd_leave(scope);
  return rc;
}

int32_t TVD_FN(load_params_file)(tvd_model* m, const char* path) {
  if (m == NULL) return TVD_ERR_ARGUMENT;
  tvd_scope scope = tvd_enter(m);
  int32_t rc = tvd_blob_ready(m, "load_params_file");
  FILE* f = NULL;
  if (rc == TVD_OK && (path == NULL || (f = fopen(path, "rb")) == NULL))
    rc = tvd_fail(m, TVD_ERR_FORMAT, "load_params_file: cannot open %s", path != NULL ? path : "(NULL)");
  long length = -1;
  if (rc == TVD_OK && (fseek(f, 0, SEEK_END) != 0 || (length = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0))
    rc = tvd_fail(m, TVD_ERR_FORMAT, "load_params_file: cannot find the length of %s", path);
  /* A byte read before the length is trusted: a directory opens and "seeks" to a length of LONG_MAX on Linux. */
  if (rc == TVD_OK && length > 0 && (fgetc(f) == EOF || fseek(f, 0, SEEK_SET) != 0))
    rc = tvd_fail(m, TVD_ERR_FORMAT, "load_params_file: cannot read %s (not a regular file?)", path);
  unsigned char* block = NULL;
  if (rc == TVD_OK &&
      (block = (unsigned char*)m->pool->allocator.alloc(m->pool->allocator.user, length ? (size_t)length : 1, 64)) == NULL)
    rc = tvd_fail(m, TVD_ERR_MEMORY, "load_params_file: out of memory (%ld bytes)", length);
  if (rc == TVD_OK && fread(block, 1, (size_t)length, f) != (size_t)length) {
    m->pool->allocator.free(m->pool->allocator.user, block);
    rc = tvd_fail(m, TVD_ERR_FORMAT, "load_params_file: cannot read the %ld bytes of %s", length, path);
  } else if (rc == TVD_OK) {
    rc = tvd_blob_adopt(m, block, (uint64_t)length, "load_params_file");
  }
  if (f != NULL) fclose(f);
  tvd_leave(scope);
  return rc;
}
