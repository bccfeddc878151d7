// The registration API as Edge-LLM's runtime reaches it: the C ABI through dlsym(RTLD_DEFAULT)
// (the library is loaded RTLD_GLOBAL), and the C++ API by its mangled names.

#include "library.h"

#include <gtest/gtest.h>

#include <thread>

namespace
{
using Register = bool (*)(int, void*, void*);
using Unregister = bool (*)(int, void*);
using CxxRegister = void (*)(int, void*, void*);
using CxxSnapshot = void (*)(int, void**, void**);
using CxxComm = void* (*) (int);
using CxxFunc = void* (*) ();

struct Api
{
    Register reg = nullptr;
    Unregister unreg = nullptr;
    CxxRegister cxxRegister = nullptr;
    CxxSnapshot snapshot = nullptr;
    CxxComm comm = nullptr;
    CxxFunc func = nullptr;
};

Api api()
{
    testlib::library();
    Api a;
    a.reg = reinterpret_cast<Register>(dlsym(RTLD_DEFAULT, "edgellmRegisterNcclCommForAllReducePlugin"));
    a.unreg = reinterpret_cast<Unregister>(dlsym(RTLD_DEFAULT, "edgellmUnregisterNcclCommForAllReducePlugin"));
    // The names a C++ caller compiled against Edge-LLM's header links to.
    a.cxxRegister = testlib::symbol<CxxRegister>("_ZN11trt_edgellm7plugins34registerNcclCommForAllReducePluginEiPvS1_");
    a.snapshot = testlib::symbol<CxxSnapshot>("_ZN11trt_edgellm7plugins28getNcclRegistrationForDeviceEiPPvS2_");
    a.comm = testlib::symbol<CxxComm>("_ZN11trt_edgellm7plugins20getNcclCommForDeviceEi");
    a.func = testlib::symbol<CxxFunc>("_ZN11trt_edgellm7plugins20getNcclAllReduceFuncEv");
    return a;
}

void* ptr(uintptr_t v)
{
    return reinterpret_cast<void*>(v);
}
} // namespace

TEST(Api, EverySymbolIsExported)
{
    Api a = api();
    EXPECT_NE(a.reg, nullptr);
    EXPECT_NE(a.unreg, nullptr);
    EXPECT_NE(a.cxxRegister, nullptr);
    EXPECT_NE(a.snapshot, nullptr);
    EXPECT_NE(a.comm, nullptr);
    EXPECT_NE(a.func, nullptr);
    EXPECT_NE(dlsym(RTLD_DEFAULT, "initEdgellmPlugins"), nullptr);
    EXPECT_NE(testlib::symbol<void*>("getCreators"), nullptr);
    EXPECT_NE(testlib::symbol<void*>("setLoggerFinder"), nullptr);
    EXPECT_EQ(testlib::symbol<void*>("rust_eh_personality"), nullptr) << "Rust internals stay hidden";
}

TEST(Api, RegisterSnapshotAndUnregister)
{
    Api a = api();
    ASSERT_TRUE(a.reg(7, ptr(0xc07), ptr(0xf00)));
    void* comm = nullptr;
    void* fn = nullptr;
    a.snapshot(7, &comm, &fn);
    EXPECT_EQ(comm, ptr(0xc07));
    EXPECT_EQ(fn, ptr(0xf00));
    EXPECT_EQ(a.comm(7), ptr(0xc07));
    EXPECT_EQ(a.func(), ptr(0xf00));
    a.snapshot(7, nullptr, nullptr); // null out-pointers are allowed

    EXPECT_FALSE(a.unreg(7, ptr(0xbad))) << "only the registered communicator unregisters";
    EXPECT_EQ(a.comm(7), ptr(0xc07));
    EXPECT_TRUE(a.unreg(7, ptr(0xc07)));
    EXPECT_FALSE(a.unreg(7, ptr(0xc07))) << "nothing left to unregister";
    a.snapshot(7, &comm, &fn);
    EXPECT_EQ(comm, nullptr);
    EXPECT_EQ(fn, nullptr);
    EXPECT_EQ(a.comm(7), nullptr);
}

TEST(Api, CxxRegistrationIsTheSameRegistry)
{
    Api a = api();
    a.cxxRegister(8, ptr(0xc08), ptr(0xf08));
    EXPECT_EQ(a.comm(8), ptr(0xc08));
    a.cxxRegister(8, ptr(0xc18), ptr(0xf08));
    EXPECT_EQ(a.comm(8), ptr(0xc18)) << "a second registration replaces the first";
    a.cxxRegister(-1, ptr(0xc08), ptr(0xf08)); // ignored, logged
    a.cxxRegister(9, nullptr, ptr(0xf08));
    EXPECT_EQ(a.comm(9), nullptr);
    EXPECT_TRUE(a.unreg(8, ptr(0xc18)));
}

TEST(Api, BadRegistrationsAreRefused)
{
    Api a = api();
    EXPECT_FALSE(a.reg(-1, ptr(1), ptr(2)));
    EXPECT_FALSE(a.reg(0, nullptr, ptr(2)));
    EXPECT_FALSE(a.reg(0, ptr(1), nullptr));
    EXPECT_FALSE(a.unreg(-5, ptr(1)));
    EXPECT_EQ(a.comm(-1), nullptr);
}

TEST(Api, RegistrationIsThreadSafe)
{
    Api a = api();
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t)
    {
        threads.emplace_back([&a, t] {
            for (uintptr_t i = 1; i <= 500; ++i)
            {
                ASSERT_TRUE(a.reg(100 + t, ptr(i), ptr(0xf)));
                void* c = nullptr;
                a.snapshot(100 + t, &c, nullptr);
                ASSERT_EQ(c, ptr(i));
            }
        });
    }
    for (auto& th : threads)
    {
        th.join();
    }
    for (int t = 0; t < 8; ++t)
    {
        EXPECT_TRUE(a.unreg(100 + t, ptr(500)));
    }
}
