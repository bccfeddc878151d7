// The communicator of the stand-in NCCL for several processes on one GPU (shm_nccl.cpp): what
// a test fills in and registers as its ncclComm_t. Plain C layout, shared by the test and the
// library.
#pragma once

#include <cstdint>

struct EdgellmShmComm
{
    // Filled by the test (the same path, rank count and slot size on every rank).
    int nranks;
    int rank;
    int device;
    int timeoutMs;      //!< the longest any wait lasts (0: 20000); then ncclSystemError
    uint64_t slotBytes; //!< the largest message per rank and call (0: 4 MiB)
    char path[256];     //!< the file every rank maps; it must not exist, or be all zeros, at the first call

    // The library's state: zero before the first call.
    void* mapping;
    uint64_t mappedBytes;
    uint64_t calls; //!< collectives this rank has posted
    int broken;     //!< a call failed: every later one fails at once
};
