/* The C ABI of the msa-rs kernels: one header per kernel family.
 * Every launcher returns a cudaError_t code (0 = success) and takes the stream last. */
#ifndef MSA_KERNELS_H
#define MSA_KERNELS_H

#include "msa/abi.h"
#include "msa/common.h"
#include "msa/util.h"
#include "msa/attention.h"
#include "msa/prepare.h"
#include "msa/task_build.h"
#include "msa/indexer.h"
#include "msa/kl.h"
#include "msa/reference.h"

#endif /* MSA_KERNELS_H */
