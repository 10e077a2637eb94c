// A timeline of one process's device work, for hosts without Nsight Systems (the lent H200s):
// loaded by the CUDA driver through CUDA_INJECTION64_PATH, it records kernels, copies, memsets
// and driver calls with CUPTI's activity API and writes them as CSV to $CUPTI_TRACE_OUT at exit.
// Columns: kind,name,start_ns,end_ns,correlation,stream,extra (queued_ns for kernels, bytes for
// copies and memsets, the callback id for driver calls). Device and host times share one clock.
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUF (8u << 20)
static FILE *out;

#define CHECK(call)                                                              \
  do {                                                                           \
    CUptiResult r_ = (call);                                                     \
    if (r_ != CUPTI_SUCCESS) {                                                   \
      const char *s_;                                                            \
      cuptiGetResultString(r_, &s_);                                             \
      fprintf(stderr, "cupti_trace: %s: %s\n", #call, s_);                       \
    }                                                                            \
  } while (0)

static void CUPTIAPI requested(uint8_t **buffer, size_t *size, size_t *max_records) {
  *buffer = aligned_alloc(8, BUF);
  *size = BUF;
  *max_records = 0;
}

static void write_record(const CUpti_Activity *r) {
  switch (r->kind) {
  case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
  case CUPTI_ACTIVITY_KIND_KERNEL: {
    const CUpti_ActivityKernel10 *k = (const void *)r;
    fprintf(out, "kernel,%s,%llu,%llu,%u,%u,%llu\n", k->name, (unsigned long long)k->start,
            (unsigned long long)k->end, k->correlationId, k->streamId,
            (unsigned long long)k->queued);
    break;
  }
  case CUPTI_ACTIVITY_KIND_MEMCPY: {
    const CUpti_ActivityMemcpy6 *m = (const void *)r;
    fprintf(out, "memcpy,kind%u,%llu,%llu,%u,%u,%llu\n", m->copyKind,
            (unsigned long long)m->start, (unsigned long long)m->end, m->correlationId,
            m->streamId, (unsigned long long)m->bytes);
    break;
  }
  case CUPTI_ACTIVITY_KIND_MEMSET: {
    const CUpti_ActivityMemset4 *m = (const void *)r;
    fprintf(out, "memset,value%u,%llu,%llu,%u,%u,%llu\n", m->value,
            (unsigned long long)m->start, (unsigned long long)m->end, m->correlationId,
            m->streamId, (unsigned long long)m->bytes);
    break;
  }
  case CUPTI_ACTIVITY_KIND_DRIVER: {
    const CUpti_ActivityAPI *a = (const void *)r;
    const char *name = "?";
    cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, a->cbid, &name);
    fprintf(out, "driver,%s,%llu,%llu,%u,0,%u\n", name, (unsigned long long)a->start,
            (unsigned long long)a->end, a->correlationId, a->cbid);
    break;
  }
  default:
    break;
  }
}

static void CUPTIAPI completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                               size_t valid) {
  CUpti_Activity *r = NULL;
  while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) write_record(r);
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped);
  if (dropped) fprintf(stderr, "cupti_trace: %zu records dropped\n", dropped);
  free(buffer);
}

static void finish(void) {
  CHECK(cuptiActivityFlushAll(1));
  if (out) fclose(out);
}

int InitializeInjection(void) {
  const char *path = getenv("CUPTI_TRACE_OUT");
  out = fopen(path ? path : "cupti_trace.csv", "w");
  if (!out) {
    perror("cupti_trace: open");
    return 0;
  }
  fprintf(out, "kind,name,start_ns,end_ns,correlation,stream,extra\n");
  CHECK(cuptiActivityRegisterCallbacks(requested, completed));
  CHECK(cuptiActivityEnableLatencyTimestamps(1));
  CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));
  CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET));
  CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER));
  atexit(finish);
  return 1;
}
