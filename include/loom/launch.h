/*
 * loom/launch.h: making a communicator from the environment a launcher sets, without
 * passing an ncclUniqueId around.
 *
 * Rank and size come from, in order: LOOM_RANK/LOOM_NRANKS, torchrun's RANK/WORLD_SIZE,
 * Open MPI's OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE, or PMI_RANK/PMI_SIZE. The root
 * address comes from LOOM_COMM_ID (or NCCL_COMM_ID), else MASTER_ADDR:MASTER_PORT.
 * Rank 0 runs the bootstrap root at that address; every rank must see the same one.
 */
#ifndef LOOM_LAUNCH_H_
#define LOOM_LAUNCH_H_

#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Creates this process's communicator. Returns ncclInvalidArgument (with a message in
 * ncclGetLastError) when the variables are missing or inconsistent. */
ncclResult_t loomCommInitFromEnv(ncclComm_t* comm);

/* Reads rank and size as loomCommInitFromEnv does, without creating anything. */
ncclResult_t loomRankFromEnv(int* rank, int* nranks);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_LAUNCH_H_ */
