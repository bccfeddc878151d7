// Test stand-ins for what TensorRT provides in a real process: the plugin registry (with
// TensorRT's rules: a duplicate name/version/namespace is refused, loadLibrary registers what
// getCreators returns), a logger, a logger finder, and an IExprBuilder. Built as
// libnvinfer.so.<major> (against TensorRT 10 and 11 headers in turn), a stand-in for TensorRT's
// runtime library: it exports getPluginRegistry and getInferLibMajorVersion, so this library
// finds them at run time exactly as it finds libnvinfer's, and Edge-LLM's own plugin library
// (which needs libnvinfer.so.<major>) loads against it.
#pragma once

#include <NvInferRuntime.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace fake
{

class Registry final : public nvinfer1::IPluginRegistry
{
public:
    struct Entry
    {
        nvinfer1::IPluginCreatorInterface* creator;
        std::string name, version, nameSpace;
    };

    static Registry& instance();

    std::vector<Entry> entries() const;
    //! How many registered creators are called `name` in namespace `ns`.
    int count(std::string const& name, std::string const& ns) const;
    //! How many creators are registered in namespace `ns`.
    int countIn(std::string const& ns) const;
    //! The registrations TensorRT would have refused as duplicates ("name/version/namespace"):
    //! TensorRT logs an error for each.
    std::vector<std::string> refused() const;
    //! What TensorRT's loadLibrary does: dlopen, getCreators, register each (refusing duplicates).
    bool simulateLoadLibrary(char const* path);

#if NV_TENSORRT_MAJOR < 11
    bool registerCreator(nvinfer1::IPluginCreator&, nvinfer1::AsciiChar const* const) noexcept override { return false; }
    nvinfer1::IPluginCreator* const* getPluginCreatorList(int32_t* const n) const noexcept override
    {
        *n = 0;
        return nullptr;
    }
    nvinfer1::IPluginCreator* getPluginCreator(nvinfer1::AsciiChar const* const, nvinfer1::AsciiChar const* const,
        nvinfer1::AsciiChar const* const) noexcept override
    {
        return nullptr;
    }
    bool deregisterCreator(nvinfer1::IPluginCreator const&) noexcept override { return false; }
#endif
    void setErrorRecorder(nvinfer1::IErrorRecorder* const) noexcept override {}
    nvinfer1::IErrorRecorder* getErrorRecorder() const noexcept override { return nullptr; }
    bool isParentSearchEnabled() const override { return false; }
    void setParentSearchEnabled(bool const) override {}
    PluginLibraryHandle loadLibrary(nvinfer1::AsciiChar const* path) noexcept override;
    void deregisterLibrary(PluginLibraryHandle) noexcept override {}
    bool registerCreator(
        nvinfer1::IPluginCreatorInterface& creator, nvinfer1::AsciiChar const* const ns) noexcept override;
    nvinfer1::IPluginCreatorInterface* const* getAllCreators(int32_t* const n) const noexcept override;
    nvinfer1::IPluginCreatorInterface* getCreator(nvinfer1::AsciiChar const* const name,
        nvinfer1::AsciiChar const* const version, nvinfer1::AsciiChar const* const ns = "") noexcept override;
    bool deregisterCreator(nvinfer1::IPluginCreatorInterface const& creator) noexcept override;
    nvinfer1::IPluginResource* acquirePluginResource(nvinfer1::AsciiChar const*, nvinfer1::IPluginResource*) noexcept override
    {
        return nullptr;
    }
    int32_t releasePluginResource(nvinfer1::AsciiChar const*) noexcept override { return -1; }
    nvinfer1::IPluginCreatorInterface* const* getAllCreatorsRecursive(int32_t* const n) noexcept override
    {
        return getAllCreators(n);
    }

private:
    mutable std::mutex mMutex;
    std::vector<Entry> mEntries;
    std::vector<std::string> mRefused;
    mutable std::vector<nvinfer1::IPluginCreatorInterface*> mList;
};

class Logger final : public nvinfer1::ILogger
{
public:
    void log(Severity severity, nvinfer1::AsciiChar const* msg) noexcept override;
    std::vector<std::string> messages() const;
    bool saw(std::string const& needle) const;
    void clear();

private:
    mutable std::mutex mMutex;
    std::vector<std::string> mMessages;
};

class LoggerFinder final : public nvinfer1::ILoggerFinder
{
public:
    explicit LoggerFinder(nvinfer1::ILogger* logger)
        : mLogger(logger)
    {
    }
    nvinfer1::ILogger* findLogger() override { return mLogger; }

private:
    nvinfer1::ILogger* mLogger;
};

//! An IExprBuilder whose expressions are constants or symbols (non-constant), as TensorRT builds.
class ExprBuilder final : public nvinfer1::IExprBuilder
{
public:
    ExprBuilder();
    ~ExprBuilder() noexcept override;
    nvinfer1::IDimensionExpr const* symbol(); //!< a dimension unknown at build time
    nvinfer1::DimsExprs dims(std::vector<int64_t> const& values); //!< -1 means a new symbol

private:
    struct Impl;
    std::unique_ptr<Impl> mOwned;
};

//! The file of the library a creator's code lives in (its vtable's), "" if unknown.
std::string ownerOf(void const* creator);

} // namespace fake

// For tests in other languages (Python's ctypes): the registry's contents.
extern "C"
{
    //! Creators registered in namespace `ns`.
    int fakeRegistryCount(char const* ns);
    //! The file of the library whose creator is registered as `name` version "1" in `ns`, "" if none.
    char const* fakeRegistryOwner(char const* name, char const* ns);
    //! Registrations refused as duplicates so far.
    int fakeRegistryRefusals();
}
