/* A stand-in for Edge-LLM's plugin library as the overlay's base that refuses every NCCL
 * registration and unregistration (as a base of another version could refuse arguments this
 * library accepts): the two libraries must stay in step, neither holding what the other
 * refused (OverlayRefusingBase, tests/cpp/overlay_test.cpp). */
extern "C" {
bool initEdgellmPlugins(void*, const char*) { return true; }
bool edgellmRegisterNcclCommForAllReducePlugin(int, void*, void*) { return false; }
bool edgellmUnregisterNcclCommForAllReducePlugin(int, void*) { return false; }
}
