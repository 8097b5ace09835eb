// xmoe._xmoe: thin nanobind bindings over the C ABI (include/xmoe/c_api.h). Tensors come in through the
// DLPack protocol (nb::ndarray views, no copy) and go out as "dltensor" capsules for torch.utils.dlpack.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "xmoe/c_api.h"

namespace nb = nanobind;

namespace {

using Array = nb::ndarray<nb::ro>;

void check(int rc) {
  if (rc != 0) throw nb::value_error(xmoe_last_error());
}

// A DLTensor view of an nb::ndarray (nanobind's DLPack structs mirror DLPack's layout field by field).
struct View {
  DLTensor t{};
  template <class... Ts>
  explicit View(const nb::ndarray<Ts...>& a) {
    t.data = const_cast<void*>(a.data());
    t.device = {static_cast<DLDeviceType>(a.device_type()), a.device_id()};
    t.ndim = static_cast<int32_t>(a.ndim());
    const nb::dlpack::dtype d = a.dtype();
    t.dtype = {d.code, d.bits, d.lanes};
    t.shape = const_cast<int64_t*>(a.shape_ptr());
    t.strides = const_cast<int64_t*>(a.stride_ptr());
    t.byte_offset = 0;
  }
};

// A "dltensor" capsule that owns `m` until a consumer renames it to "used_dltensor" and takes it over.
nb::object capsule_of(DLManagedTensor* m) {
  PyObject* c = PyCapsule_New(m, "dltensor", [](PyObject* self) {
    if (PyCapsule_IsValid(self, "dltensor")) {
      auto* t = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(self, "dltensor"));
      if (t->deleter) t->deleter(t);
    }
  });
  if (!c) {
    m->deleter(m);
    throw nb::python_error();
  }
  return nb::steal(c);
}

// A non-owning capsule over a view (the caller copies it at once).
nb::object borrowed_capsule(const DLTensor& t) {
  auto* m = new DLManagedTensor{};
  m->dl_tensor = t;
  m->deleter = [](DLManagedTensor* self) { delete self; };
  return capsule_of(m);
}

// Runs a C ABI call without the GIL (it may wait in a collective for other ranks), then raises its error.
template <class F>
void check_without_gil(F&& call) {
  int rc;
  {
    nb::gil_scoped_release release;
    rc = call();
  }
  check(rc);
}

// A communicator (xmoe_comm): the world of an MPI session or a group split from it.
class Comm {
 public:
  explicit Comm(xmoe_comm* c) : comm_(c) {}
  ~Comm() { xmoe_comm_destroy(comm_); }
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return xmoe_comm_rank(comm_); }
  int size() const { return xmoe_comm_size(comm_); }
  std::string name() const { return xmoe_comm_name(comm_); }
  Comm* split(int color, int key) {
    xmoe_comm* out = nullptr;
    check_without_gil([&] { return xmoe_comm_split(comm_, color, key, &out); });
    return new Comm(out);
  }
  void all_reduce(nb::ndarray<> data, const std::string& op) {
    View v(data);
    check_without_gil([&] { return xmoe_comm_all_reduce(comm_, &v.t, op.c_str()); });
  }
  void broadcast(nb::ndarray<> data, int root) {
    View v(data);
    check_without_gil([&] { return xmoe_comm_broadcast(comm_, &v.t, root); });
  }
  void barrier() {
    check_without_gil([&] { return xmoe_comm_barrier(comm_); });
  }
  xmoe_comm* get() const { return comm_; }

 private:
  xmoe_comm* comm_;
};

// The process's MPI session (MPI_Init_thread on creation, MPI_Finalize on close()).
class MpiSession {
 public:
  MpiSession() { check(xmoe_mpi_session_create(&session_)); }
  ~MpiSession() { close(); }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  Comm* world() {
    if (!session_) throw nb::value_error("MPI session: already closed (MPI was finalized)");
    xmoe_comm* out = nullptr;
    check_without_gil([&] { return xmoe_mpi_session_world(session_, &out); });
    return new Comm(out);
  }
  void close() {
    if (session_) xmoe_mpi_session_destroy(session_);
    session_ = nullptr;
  }

 private:
  xmoe_mpi_session* session_ = nullptr;
};

class Layer {
 public:
  Layer(const nb::dict& cfg, const Comm* group) {
    xmoe_layer_config c;
    xmoe_layer_config_init(&c);
    // Strings must outlive the create call.
    std::string gate_type = nb::cast<std::string>(cfg["gate_type"]);
    std::string expert_type = nb::cast<std::string>(cfg["expert_type"]);
    std::string activation = nb::cast<std::string>(cfg["activation"]);
    std::string isa = cfg.contains("isa") ? nb::cast<std::string>(cfg["isa"]) : "";
    std::string dtype = nb::cast<std::string>(cfg["dtype"]);
    c.gate_type = gate_type.c_str();
    c.k = nb::cast<int32_t>(cfg["k"]);
    c.capacity_factor = nb::cast<double>(cfg["capacity_factor"]);
    c.gate_noise = nb::cast<double>(cfg["gate_noise"]);
    c.fp32_gate = nb::cast<bool>(cfg["fp32_gate"]);
    c.proj_dim = nb::cast<int64_t>(cfg["proj_dim"]);
    c.init_t = nb::cast<double>(cfg["init_t"]);
    c.model_dim = nb::cast<int64_t>(cfg["model_dim"]);
    c.expert_type = expert_type.c_str();
    c.num_experts = nb::cast<int32_t>(cfg["num_experts"]);
    c.hidden_size = nb::cast<int64_t>(cfg["hidden_size"]);
    c.output_dim = nb::cast<int64_t>(cfg["output_dim"]);
    c.activation = activation.c_str();
    c.has_fc1_bias = nb::cast<bool>(cfg["has_fc1_bias"]);
    c.has_fc2_bias = nb::cast<bool>(cfg["has_fc2_bias"]);
    if (dtype == "float32")
      c.dtype = {kDLFloat, 32, 1};
    else if (dtype == "float64")
      c.dtype = {kDLFloat, 64, 1};
    else if (dtype == "bfloat16")
      c.dtype = {kDLBfloat, 16, 1};
    else
      throw nb::value_error(("dtype: expected float32, float64 or bfloat16, got " + dtype).c_str());
    c.is_postscore = nb::cast<bool>(cfg["is_postscore"]);
    c.batch_prioritized_routing = nb::cast<bool>(cfg["batch_prioritized_routing"]);
    c.normalize_gate = nb::cast<bool>(cfg["normalize_gate"]);
    c.is_gshard_loss = nb::cast<bool>(cfg["is_gshard_loss"]);
    c.capacity_alignment = nb::cast<int64_t>(cfg["capacity_alignment"]);
    c.seed_gate = nb::cast<uint64_t>(cfg["seed_gate"]);
    c.seed_experts = nb::cast<uint64_t>(cfg["seed_experts"]);
    c.isa = isa.c_str();
    c.adaptive_r = nb::cast<int32_t>(cfg["adaptive_r"]);
    c.a2a_overlap_degree = nb::cast<int32_t>(cfg["a2a_ffn_overlap_degree"]);
    c.use_2dh = nb::cast<bool>(cfg["use_2dh"]);
    c.local_size = nb::cast<int32_t>(cfg["local_size"]);
    check_without_gil(
        [&] { return xmoe_layer_create_in_group(&c, group ? group->get() : nullptr, &layer_); });
  }
  ~Layer() { xmoe_layer_destroy(layer_); }
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  // [(name, is_expert, capsule over the layer's current value)]; copy the values before any rebinding.
  std::vector<std::tuple<std::string, bool, nb::object>> params() {
    std::vector<std::tuple<std::string, bool, nb::object>> out;
    for (int64_t i = 0; i < xmoe_layer_num_params(layer_); ++i) {
      const char* name = nullptr;
      int32_t is_expert = 0;
      DLTensor v{};
      check(xmoe_layer_param(layer_, i, &name, &is_expert, &v));
      out.emplace_back(name, is_expert != 0, borrowed_capsule(v));
    }
    return out;
  }

  void bind(int64_t i, std::optional<Array> value, std::optional<Array> grad) {
    std::optional<View> v, g;
    if (value) v.emplace(*value);
    if (grad) g.emplace(*grad);
    check(xmoe_layer_bind_param(layer_, i, v ? &v->t : nullptr, g ? &g->t : nullptr));
  }

  std::tuple<nb::object, double> forward(const Array& x, int top_k, std::optional<double> capacity_factor,
                                         bool grouped, bool training, std::optional<Array> noise,
                                         int adaptive_r, int a2a_overlap_degree) {
    xmoe_switches s;
    xmoe_switches_init(&s);
    s.top_k = top_k;
    s.has_capacity_factor = capacity_factor.has_value();
    s.capacity_factor = capacity_factor.value_or(0.0);
    s.grouped = grouped;
    s.training = training;
    std::optional<View> nv;
    if (noise) nv.emplace(*noise);
    s.noise = nv ? &nv->t : nullptr;
    s.adaptive_r = adaptive_r;
    s.a2a_overlap_degree = a2a_overlap_degree;
    const View xv(x);
    DLManagedTensor* y = nullptr;
    double aux = 0;
    int rc;
    {
      nb::gil_scoped_release release;
      rc = xmoe_layer_forward(layer_, &xv.t, &s, &y, &aux);
    }
    check(rc);
    return {capsule_of(y), aux};
  }

  nb::object backward(const Array& dy, double daux) {
    const View v(dy);
    DLManagedTensor* dx = nullptr;
    int rc;
    {
      nb::gil_scoped_release release;
      rc = xmoe_layer_backward(layer_, &v.t, daux, &dx);
    }
    check(rc);
    return capsule_of(dx);
  }

  int64_t output_dim() const { return xmoe_layer_output_dim(layer_); }
  std::string kernel_isa() const { return xmoe_layer_kernel_isa(layer_); }

 private:
  xmoe_layer* layer_ = nullptr;
};

class Llm {
 public:
  Llm(const std::string& model_dir, const std::string& dtype, const std::string& isa) {
    int rc;
    {
      nb::gil_scoped_release release;
      rc = xmoe_llm_open(model_dir.c_str(), dtype.c_str(), isa.c_str(), &llm_);
    }
    check(rc);
  }
  ~Llm() { xmoe_llm_destroy(llm_); }
  Llm(const Llm&) = delete;
  Llm& operator=(const Llm&) = delete;

  // prompts: text or token ids. Returns [(text bytes, ids, finish reason)].
  std::vector<std::tuple<nb::bytes, std::vector<int32_t>, std::string>> generate(
      const std::vector<std::variant<std::string, std::vector<int32_t>>>& prompts, int64_t max_tokens,
      std::optional<double> temperature, std::optional<uint64_t> seed, bool ignore_eos) {
    std::vector<xmoe_generation_request> reqs(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      xmoe_generation_request& r = reqs[i];
      xmoe_generation_request_init(&r);
      if (const auto* text = std::get_if<std::string>(&prompts[i])) {
        r.prompt = text->c_str();
      } else {
        const auto& ids = std::get<std::vector<int32_t>>(prompts[i]);
        r.prompt_ids = ids.data();
        r.num_prompt_ids = static_cast<int64_t>(ids.size());
      }
      r.max_tokens = max_tokens;
      r.has_temperature = temperature.has_value();
      r.temperature = temperature.value_or(1.0);
      r.has_seed = seed.has_value();
      r.seed = seed.value_or(0) + i;
      r.ignore_eos = ignore_eos;
    }
    xmoe_generations* g = nullptr;
    int rc;
    {
      nb::gil_scoped_release release;
      rc = xmoe_llm_generate(llm_, reqs.data(), static_cast<int64_t>(reqs.size()), &g);
    }
    check(rc);
    std::vector<std::tuple<nb::bytes, std::vector<int32_t>, std::string>> out;
    for (int64_t i = 0; i < xmoe_generations_count(g); ++i) {
      int64_t n = 0;
      size_t len = 0;
      const int32_t* ids = xmoe_generations_ids(g, i, &n);
      const char* text = xmoe_generations_text(g, i, &len);
      out.emplace_back(nb::bytes(text, len), std::vector<int32_t>(ids, ids + n),
                       xmoe_generations_finish_reason(g, i));
    }
    xmoe_generations_destroy(g);
    return out;
  }

 private:
  xmoe_llm* llm_ = nullptr;
};

}  // namespace

NB_MODULE(_xmoe, m) {
  m.doc() = "xmoe's C ABI from Python (used by xmoe.moe and xmoe.LLM)";
  // Layers held by autograd graphs alive at interpreter exit are not leaks worth a warning.
  nb::set_leak_warnings(false);
  m.attr("c_api_version") = xmoe_c_api_version();
  m.attr("mpi_available") = xmoe_mpi_available() != 0;
  nb::class_<Comm>(m, "Comm")
      .def_prop_ro("rank", &Comm::rank)
      .def_prop_ro("size", &Comm::size)
      .def_prop_ro("name", &Comm::name)
      .def("split", &Comm::split, nb::arg("color"), nb::arg("key"), nb::rv_policy::take_ownership)
      .def("all_reduce", &Comm::all_reduce, nb::arg("data"), nb::arg("op"))
      .def("broadcast", &Comm::broadcast, nb::arg("data"), nb::arg("root"))
      .def("barrier", &Comm::barrier);
  nb::class_<MpiSession>(m, "MpiSession")
      .def(nb::init<>())
      .def("world", &MpiSession::world, nb::rv_policy::take_ownership)
      .def("close", &MpiSession::close);
  nb::class_<Layer>(m, "Layer")
      .def(nb::init<const nb::dict&, const Comm*>(), nb::arg("config"), nb::arg("group").none() = nb::none())
      .def("params", &Layer::params)
      .def("bind", &Layer::bind, nb::arg("index"), nb::arg("value").none(), nb::arg("grad").none())
      .def("forward", &Layer::forward, nb::arg("x"), nb::arg("top_k"), nb::arg("capacity_factor").none(),
           nb::arg("grouped"), nb::arg("training"), nb::arg("noise").none(), nb::arg("adaptive_r"),
           nb::arg("a2a_overlap_degree"))
      .def("backward", &Layer::backward, nb::arg("dy"), nb::arg("daux"))
      .def_prop_ro("output_dim", &Layer::output_dim)
      .def_prop_ro("kernel_isa", &Layer::kernel_isa);
  nb::class_<Llm>(m, "LLM")
      .def(nb::init<const std::string&, const std::string&, const std::string&>(), nb::arg("model_dir"),
           nb::arg("dtype"), nb::arg("isa"))
      .def("generate", &Llm::generate, nb::arg("prompts"), nb::arg("max_tokens"),
           nb::arg("temperature").none(), nb::arg("seed").none(), nb::arg("ignore_eos"));
  m.def(
      "fill_normal",
      [](uint64_t seed, uint64_t stream, nb::ndarray<> out) {
        View v(out);
        check(xmoe_fill_normal(seed, stream, &v.t));
      },
      nb::arg("seed"), nb::arg("stream"), nb::arg("out"));
}
