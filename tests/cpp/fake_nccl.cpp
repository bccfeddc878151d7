// A stand-in for libnccl.so.2 in the CPU fault tests (faults_test.cpp), loaded with dlopen
// (RTLD_LOCAL: it interposes on nothing). A registered communicator is a pointer to a FakeComm
// whose fields are what NCCL's queries answer, so a test can describe any communicator, however
// wrong. The collectives do nothing and fail: without a GPU nothing may reach them.

#include <cstddef>

namespace
{
struct FakeComm
{
    int nranks;
    int rank;
    int device;
};
} // namespace

extern "C"
{
    int ncclCommCount(void* comm, int* count)
    {
        *count = static_cast<FakeComm*>(comm)->nranks;
        return 0;
    }
    int ncclCommUserRank(void* comm, int* rank)
    {
        *rank = static_cast<FakeComm*>(comm)->rank;
        return 0;
    }
    int ncclCommCuDevice(void* comm, int* device)
    {
        *device = static_cast<FakeComm*>(comm)->device;
        return 0;
    }
    int ncclAllReduce(void const*, void*, size_t, int, int, void*, void*)
    {
        return 5; // ncclInvalidUsage
    }
    int ncclAllGather(void const*, void*, size_t, int, void*, void*)
    {
        return 5;
    }
}
