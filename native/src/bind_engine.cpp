// Python face of the engine: pvm_dist._native.Engine. Conversions only; behaviour is in pvm_core.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "pvm/engine_factory.h"

namespace py = pybind11;

namespace {

template <class T>
std::vector<T> vec(const py::dict& d, const char* key) {
    auto a = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(d[key]);
    if (!a) throw std::invalid_argument(std::string("topology['") + key + "'] is not an array");
    return std::vector<T>(a.data(), a.data() + a.size());
}

pvm::Topology topology_from_dict(const py::dict& d) {
    pvm::Topology t;
    t.n_units = d["n_units"].cast<int64_t>();
    t.hidden = d["hidden"].cast<int64_t>();
    t.n_layers = d["n_layers"].cast<int64_t>();
    t.image_size = d["image_size"].cast<int64_t>();
    t.x_total = d["x_total"].cast<int64_t>();
    t.y_total = d["y_total"].cast<int64_t>();
    t.h_total = d["h_total"].cast<int64_t>();
    t.n_weights = d["n_weights"].cast<int64_t>();
    t.x_off = vec<int64_t>(d, "x_off");
    t.y_off = vec<int64_t>(d, "y_off");
    t.h_off = vec<int64_t>(d, "h_off");
    t.w0_off = vec<int64_t>(d, "w0_off");
    t.w1_off = vec<int64_t>(d, "w1_off");
    t.unit_layer = vec<int64_t>(d, "unit_layer");
    t.x_kind = vec<int8_t>(d, "x_kind");
    t.x_src = vec<int64_t>(d, "x_src");
    t.h_bias = vec<int64_t>(d, "h_bias");
    t.raw_context_dst = vec<int64_t>(d, "raw_context_dst");
    t.raw_context_src = vec<int64_t>(d, "raw_context_src");
    t.target_src = vec<int64_t>(d, "target_src");
    t.y_bin = vec<int32_t>(d, "y_bin");
    t.y_unit = vec<int32_t>(d, "y_unit");
    t.baseline_src = vec<int64_t>(d, "baseline_src");
    if (static_cast<int64_t>(t.x_kind.size()) != t.x_total || static_cast<int64_t>(t.target_src.size()) != t.y_total ||
        static_cast<int64_t>(t.baseline_src.size()) != t.y_total ||
        static_cast<int64_t>(t.x_off.size()) != t.n_units + 1)
        throw std::invalid_argument("topology arrays do not match their totals");
    return t;
}

void check_frames(const pvm::Engine& e, const py::array& frames) {
    const auto& t = e.topology();
    if (frames.ndim() != 4 || frames.shape(0) != e.config().n_seq ||
        frames.shape(1) * frames.shape(2) * frames.shape(3) != t.image_size)
        throw std::invalid_argument("frames must be [n_seq, D, D, C] matching the engine");
}

}  // namespace

void bind_engine(py::module_& m) {
    py::class_<pvm::Engine>(m, "Engine", "A native PVM engine (CPU or CUDA); use pvm_dist.build_engine.")
        .def(py::init([](const py::dict& topology, bool polynomial, int derivative, bool opt_abs_diff, int64_t n_seq,
                         const std::string& device, int precision) {
                 pvm::EngineConfig cfg;
                 cfg.polynomial = polynomial;
                 cfg.derivative = derivative;
                 cfg.opt_abs_diff = opt_abs_diff;
                 cfg.n_seq = n_seq;
                 cfg.precision = precision;
                 return pvm::make_engine(topology_from_dict(topology), cfg, device);
             }),
             py::arg("topology"), py::arg("polynomial"), py::arg("derivative"), py::arg("opt_abs_diff"),
             py::arg("n_seq"), py::arg("device"), py::arg("precision") = 0)
        .def(
            "step",
            [](pvm::Engine& e, const py::array& frames) {
                check_frames(e, frames);
                if (py::isinstance<py::array_t<uint8_t>>(frames)) {
                    auto a = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>::ensure(frames);
                    py::gil_scoped_release release;
                    e.step_u8(a.data());
                } else if (py::isinstance<py::array_t<float>>(frames)) {
                    auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(frames);
                    py::gil_scoped_release release;
                    e.step_f32(a.data());
                } else {
                    throw std::invalid_argument("frames must be uint8 or float32");
                }
            },
            "Train one step on frames [n_seq, D, D, C] (uint8 BGR or float32 in [0, 1]).")
        .def(
            "read",
            [](pvm::Engine& e, const std::string& name) {
                py::array_t<float> out(e.buffer_size(name));
                e.read(name, out.mutable_data());
                return out;
            },
            "A copy of a named state buffer as a flat float32 array.")
        .def(
            "write",
            [](pvm::Engine& e, const std::string& name, const py::array_t<float, py::array::c_style | py::array::forcecast>& a) {
                if (a.size() != e.buffer_size(name))
                    throw std::invalid_argument("buffer '" + name + "' needs " + std::to_string(e.buffer_size(name)) +
                                                " values, got " + std::to_string(a.size()));
                e.write(name, a.data());
            },
            "Overwrite a named state buffer from a flat float32 array.")
        .def_property("step_index", &pvm::Engine::step_index, &pvm::Engine::set_step_index)
        .def(
            "take_metrics",
            [](pvm::Engine& e) {
                const pvm::MetricSums m = e.take_metric_sums();
                return py::make_tuple(py::array_t<double>(m.errors.size(), m.errors.data()),
                                      py::array_t<double>(m.baseline.size(), m.baseline.data()), m.steps);
            },
            "(per (layer, half) sums of squared errors, the copy-last-frame baseline's [two-step, one-step] sums, "
            "steps covered) since the last call; resets them.")
        .def_property_readonly("device", &pvm::Engine::device_name)
        .def_property_readonly("chained_launches", &pvm::Engine::chained_launches,
                               "Whether a step's kernels launch as programmatic dependents of each other (CUDA, sm_90+, "
                               "CUDA 12.3+, up to 16 sequences; PVM_CUDA_CHAIN=0 turns it off, =all chains every n_seq).")
        .def_property_readonly("wgmma_products", &pvm::Engine::wgmma_products,
                               "Whether per-unit products run on wgmma (CUDA, from 9 sequences, an sm_90a build on compute "
                               "capability 9.0; PVM_CUDA_WGMMA=0 turns it off).")
        .def("synchronize", &pvm::Engine::synchronize, py::call_guard<py::gil_scoped_release>(),
             "Wait until queued device work is done.")
        .def(
            "profile_step",
            [](pvm::Engine& e, const py::array_t<uint8_t, py::array::c_style | py::array::forcecast>& frames) {
                check_frames(e, frames);
                return e.profile_step_u8(frames.data());
            },
            "Train one step (uint8 frames) timing each phase; returns [(phase, milliseconds)].")
        .def(
            "set_dataset",
            [](pvm::Engine& e, const py::array_t<uint8_t, py::array::c_style | py::array::forcecast>& frames,
               int64_t first_step) {
                const int64_t block = e.config().n_seq * e.topology().image_size;
                if (frames.size() == 0 || frames.size() % block != 0)
                    throw std::invalid_argument("a dataset is [T, n_seq, D, D, C] uint8: a multiple of " +
                                                std::to_string(block) + " bytes, got " + std::to_string(frames.size()));
                py::gil_scoped_release release;
                e.set_dataset_u8(frames.data(), frames.size() / block, first_step);
            },
            py::arg("frames"), py::arg("first_step"),
            "Hold frames [T, n_seq, D, D, C] uint8 (copied to the device once); step s reads block (s - first_step) mod T.")
        .def("set_dataset_device", &pvm::Engine::set_dataset_device_u8, py::arg("address"), py::arg("n_frames"),
             py::arg("first_step"), "The same with frames already in this GPU's memory (used in place, not copied).")
        .def("run_dataset", &pvm::Engine::run_dataset, py::arg("n_steps"), py::call_guard<py::gil_scoped_release>(),
             "Train n_steps steps on the dataset (no frame crosses from the host; rates unchanged).")
        .def_property_readonly("dataset_frames", &pvm::Engine::dataset_frames)
        .def("device_pointer", &pvm::Engine::device_pointer, py::arg("name"),
             "Device address of a state buffer, or of 'error' (the last step's output errors, rebuilt by this call on the engine's stream; CUDA engines only).")
        .def_static("buffer_names", &pvm::buffer_names);
}
