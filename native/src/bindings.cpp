// pybind11 module pvm_dist._native: the Python face of the native engine. Glue only: conversions
// between C++ structs and Python objects live here, behaviour lives in pvm_core.
#include <pybind11/pybind11.h>

#include "pvm/bandwidth.h"
#include "pvm/build_info.h"
#include "pvm/cuda_error.h"

namespace py = pybind11;

void bind_engine(py::module_& m);  // bind_engine.cpp

namespace {

py::object optional_str(const std::optional<std::string>& value) {
    return value ? py::object(py::str(*value)) : py::object(py::none());
}

py::dict device_to_dict(const pvm::CudaDeviceInfo& device) {
    py::dict d;
    d["index"] = device.index;
    d["name"] = device.name;
    d["compute_capability"] = device.compute_capability();
    d["total_memory_bytes"] = device.total_memory_bytes;
    d["multiprocessor_count"] = device.multiprocessor_count;
    return d;
}

py::dict build_info_to_dict(const pvm::BuildInfo& info) {
    py::list devices;
    for (const auto& device : info.cuda.devices) {
        devices.append(device_to_dict(device));
    }
    py::dict d;
    d["version"] = info.version;
    d["compiler"] = info.compiler;
    d["cxx_standard"] = info.cxx_standard;
    d["cuda_compiled"] = info.cuda_compiled;
    d["cuda_runtime_version"] = optional_str(info.cuda.runtime_version);
    d["cuda_driver_version"] = optional_str(info.cuda.driver_version);
    d["cuda_architectures"] = optional_str(info.cuda_architectures);
    d["devices"] = devices;
    d["cuda_error"] = optional_str(info.cuda.error);
    return d;
}

}  // namespace

PYBIND11_MODULE(_native, m) {
    m.doc() = "pvm-dist native engine (C++17, CUDA optional). Nothing touches CUDA at import time.";
    m.attr("__version__") = pvm::version();

    // Failed CUDA calls (PVM_CUDA_CHECK) surface as pvm_dist._native.CudaError, a RuntimeError.
    py::register_exception<pvm::CudaError>(m, "CudaError", PyExc_RuntimeError);

    // Invalid arguments from C++ (std::invalid_argument) surface as ValueError (pybind11's default).
    bind_engine(m);

    m.def("measure_copy_bandwidth", &pvm::measure_copy_bandwidth, py::arg("device") = 0,
          py::arg("bytes") = int64_t{1} << 30, py::arg("repeats") = 20, py::call_guard<py::gil_scoped_release>(),
          "Bytes per second (read + written) of a device-to-device copy: the median of `repeats`.");

    m.def(
        "build_info", [] { return build_info_to_dict(pvm::build_info()); },
        "What this build is and which CUDA devices it sees now: version, compiler, cxx_standard, "
        "cuda_compiled, cuda_runtime_version, cuda_driver_version, cuda_architectures, devices "
        "(index, name, compute_capability, total_memory_bytes, multiprocessor_count) and cuda_error "
        "(None, or why no device could be queried). Never raises for a missing GPU or driver.");
}
