// torch/torch_optimizer.cc — zero/torch.h: a torch::nn::Module's parameters as ShardedOptimizer buffer pairs (one
// per bucket), the module's tensors made views into them, and autograd post-hooks that hand each bucket over as
// backward finishes it (DDP's reducer, over zero's reduce-scatter).
#include "zero/torch.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "zero/sharded_optimizer.h"

namespace zero {
namespace {

torch::ScalarType TorchType(DType d) {
  switch (d) {
    case DType::kF32: return torch::kFloat32;
    case DType::kBF16: return torch::kBFloat16;
    case DType::kF16: return torch::kFloat16;
    default: return torch::kFloat32;
  }
}

std::string ShapeText(torch::IntArrayRef s) { return absl::StrCat("[", absl::StrJoin(s, ","), "]"); }

// A torch group's options as a zero ParamGroup over its parameters' names, checked against the config's optimizer.
StatusOr<ParamGroup> GroupFromTorch(const OptimizerConfig& opt, const torch::optim::OptimizerParamGroup& g,
                                    size_t index) {
  ParamGroup out;
  if (!g.has_options()) return out;
  const std::string where = absl::StrCat("TorchOptimizer::Create: param group ", index);
  const torch::optim::OptimizerOptions& o = g.options();
  auto lr_scale = [&](double lr) -> StatusOr<double> {
    if (opt.lr <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": its lr ", lr,
                                                     " is relative to optimizer.params.lr, "
                                                     "which is ",
                                                     opt.lr, "; give the config a positive lr"));
    }
    return lr / opt.lr;
  };
  // AdamWOptions and AdamOptions carry the same fields.
  auto adam = [&](const auto& a) -> Status {
    if (a.amsgrad()) return absl::InvalidArgumentError(absl::StrCat(where, ": amsgrad is not supported"));
    out.weight_decay = a.weight_decay();
    out.beta1 = std::get<0>(a.betas());
    out.beta2 = std::get<1>(a.betas());
    out.eps = a.eps();
    ZERO_ASSIGN_OR_RETURN(out.lr_scale, lr_scale(a.lr()));
    return absl::OkStatus();
  };
  if (const auto* w = dynamic_cast<const torch::optim::AdamWOptions*>(&o)) {
    if (opt.type != "AdamW" && !(opt.type == "Adam" && opt.adam_w_mode)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": AdamWOptions, but the config's optimizer is ", opt.type,
                                                     opt.adam_w_mode ? "" : " with adam_w_mode false"));
    }
    ZERO_RETURN_IF_ERROR(adam(*w));
  } else if (const auto* a = dynamic_cast<const torch::optim::AdamOptions*>(&o)) {
    if (opt.type != "Adam" || opt.adam_w_mode) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": AdamOptions (L2 weight decay), but the config's optimizer is ", opt.type,
          opt.type == "Adam" ? " with adam_w_mode true (DeepSpeed's default: decoupled decay, torch's AdamW)" : ""));
    }
    ZERO_RETURN_IF_ERROR(adam(*a));
  } else if (const auto* s = dynamic_cast<const torch::optim::SGDOptions*>(&o)) {
    if (opt.type != "SGD") {
      return absl::InvalidArgumentError(absl::StrCat(where, ": SGDOptions, but the config's optimizer is ", opt.type));
    }
    if (s->momentum() != opt.momentum || s->dampening() != opt.dampening || s->nesterov() != opt.nesterov) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": momentum, dampening and nesterov are per optimizer in zero; this group's (",
                       s->momentum(), ", ", s->dampening(), ", ", s->nesterov(), ") differ from the config's (",
                       opt.momentum, ", ", opt.dampening, ", ", opt.nesterov, ")"));
    }
    out.weight_decay = s->weight_decay();
    ZERO_ASSIGN_OR_RETURN(out.lr_scale, lr_scale(s->lr()));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": options of a torch optimizer zero does not run (AdamW, Adam and SGD are)"));
  }
  return out;
}

}  // namespace

struct TorchOptimizer::State {
  struct Param {
    std::string name;
    torch::Tensor tensor;  // the module's parameter (the same TensorImpl)
    int bucket = 0;
    int64_t offset = 0;  // elements into the bucket's buffers
    std::vector<int64_t> shape;
    bool trainable = true;
  };
  struct Bucket {
    torch::Tensor params, grads;  // flat, capacity elements of the compute dtype (grads undefined when frozen)
    std::vector<int> members;     // indices into params
    bool frozen = false;
    int pending = 0;  // gradients still to arrive in this backward
    bool handed = false;
  };
  std::vector<Param> params;
  std::vector<Bucket> buckets;
  std::unique_ptr<ShardedOptimizer> opt;
  torch::ScalarType dtype = torch::kFloat32;
  bool overlap = true;
  int no_sync = 0;
  bool checked = false;  // this backward's first hook checked the views
  Status hook_error;
  // The hooks on the gradient accumulators (shared_ptr: a variable holds its accumulator only weakly).
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>> hooks;

  torch::Tensor ParamView(const Param& p) const {
    return buckets[p.bucket].params.narrow(0, p.offset, std::max<int64_t>(1, Numel(p))).view(p.shape);
  }
  torch::Tensor GradView(const Param& p) const {
    return buckets[p.bucket].grads.narrow(0, p.offset, std::max<int64_t>(1, Numel(p))).view(p.shape);
  }
  // Whether `t` is parameter p's view into `flat` (a bucket's params or grads): its place, shape and dtype,
  // compared without making a view (the check runs every step and every backward).
  bool IsView(const torch::Tensor& t, const torch::Tensor& flat, const Param& p) const {
    return t.defined() && t.scalar_type() == dtype && t.sizes() == torch::IntArrayRef(p.shape) &&
           t.data_ptr() == static_cast<char*>(flat.data_ptr()) + p.offset * static_cast<int64_t>(flat.element_size());
  }
  static int64_t Numel(const Param& p) {
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    return n;
  }

  // Makes every parameter (and trainable gradient) a view into the buckets, copying its current values in.
  Status Attach(bool copy_values) {
    try {
      return AttachOrThrow(copy_values);
    } catch (const c10::Error& e) {  // libtorch reports through exceptions; zero's API through Status
      return absl::InvalidArgumentError(
          absl::StrCat("TorchOptimizer: libtorch refused to make the parameters views "
                       "of zero's buffers: ",
                       e.what_without_backtrace()));
    }
  }
  Status AttachOrThrow(bool copy_values) {
    torch::NoGradGuard no_grad;
    for (Param& p : params) {
      torch::Tensor view = ParamView(p);
      if (copy_values) {
        if (p.tensor.sizes() != view.sizes()) {
          return absl::InvalidArgumentError(absl::StrCat("TorchOptimizer: parameter ", p.name, " has shape ",
                                                         ShapeText(p.tensor.sizes()), ", registered as ",
                                                         ShapeText(view.sizes())));
        }
        if (p.tensor.data_ptr() != view.data_ptr()) view.copy_(p.tensor.detach());
      }
      p.tensor.set_data(view);
      if (p.trainable) {
        torch::Tensor g = GradView(p);
        const torch::Tensor& old = p.tensor.grad();
        if (copy_values && old.defined() && old.data_ptr() != g.data_ptr() && old.sizes() == g.sizes()) g.copy_(old);
        p.tensor.mutable_grad() = g;
      }
    }
    return absl::OkStatus();
  }

  void RemoveHooks() {
    for (auto& [node, key] : hooks) node->del_post_hook(key);
    hooks.clear();
  }
  void AddHooks() {
    RemoveHooks();
    if (!overlap) return;
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i].trainable) continue;
      std::shared_ptr<torch::autograd::Node> acc = torch::autograd::impl::grad_accumulator(params[i].tensor);
      if (acc == nullptr) continue;  // not a leaf that requires grad: its bucket is reduced at step()
      const int index = static_cast<int>(i);
      const uintptr_t key = acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [this, index](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
            Accumulated(index);
            return outputs;
          }));
      hooks.emplace_back(std::move(acc), key);
    }
  }

  void ResetPending() {
    checked = false;
    for (Bucket& b : buckets) {
      b.handed = false;
      b.pending = 0;
      for (int i : b.members) b.pending += params[i].trainable ? 1 : 0;
    }
  }

  // The post-hook: parameter `index`'s gradient of this backward is accumulated.
  void Accumulated(int index) {
    if (no_sync > 0 || !hook_error.ok()) return;
    if (!checked) {
      // Once per backward, before any bucket is handed over: a parameter or gradient that moved (set to none
      // before this backward, torch::load since the last step) fails the step on every rank with nothing in flight.
      checked = true;
      hook_error = CheckViews();
      if (!hook_error.ok()) return;
    }
    const int bi = params[index].bucket;
    Bucket& b = buckets[bi];
    if (b.handed) {
      hook_error = absl::FailedPreconditionError(
          absl::StrCat("TorchOptimizer: backward ran again before step() (parameter ", params[index].name,
                       "'s bucket was already reduced); accumulate gradients over micro-steps inside no_sync()"));
      return;
    }
    if (--b.pending > 0) return;
    b.handed = true;
    if (Status s = opt->GradientsReady(bi); !s.ok()) hook_error = s;
  }

  bool GradIsOurs(const Param& p) const { return IsView(p.tensor.grad(), buckets[p.bucket].grads, p); }

  // The first parameter or gradient that no longer views zero's buffers, as an error that says what to do.
  Status CheckViews() const {
    for (const Param& p : params) {
      if (!IsView(p.tensor, buckets[p.bucket].params, p)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "TorchOptimizer::step: parameter ", p.name,
            " no longer views zero's buffer (its storage was replaced: torch::load, .to(), set_data); zero would "
            "update memory the model no longer reads. Call reload() after such a change to adopt the module's "
            "current values"));
      }
      if (p.trainable && !GradIsOurs(p)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "TorchOptimizer::step: the gradient of parameter ", p.name,
            p.tensor.grad().defined() ? " is not zero's gradient buffer (it was assigned)"
                                      : " is none (set to none, by zero_grad(true) for example)",
            ", so backward accumulated where zero does not reduce. Clear gradients with TorchOptimizer::zero_grad(), "
            "which keeps the views; reload() re-attaches them, keeping the values"));
      }
    }
    return absl::OkStatus();
  }
};

StatusOr<std::unique_ptr<TorchOptimizer>> TorchOptimizer::Create(const Config& config,
                                                                 std::shared_ptr<Communicator> comm,
                                                                 torch::nn::Module& model, TorchOptions options) {
  std::vector<torch::Tensor> all;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) all.push_back(item.value());
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::move(all));
  return Create(config, std::move(comm), model, std::move(groups), std::move(options));
}

StatusOr<std::unique_ptr<TorchOptimizer>> TorchOptimizer::Create(const Config& config,
                                                                 std::shared_ptr<Communicator> comm,
                                                                 torch::nn::Module& model,
                                                                 std::vector<torch::optim::OptimizerParamGroup> groups,
                                                                 TorchOptions options) {
  if (comm == nullptr) return absl::InvalidArgumentError("TorchOptimizer::Create: communicator is null");
  auto st = std::make_unique<State>();
  st->overlap = options.overlap;
  const DType dtype = config.fp16.enabled ? DType::kF16 : config.bf16.enabled ? DType::kBF16 : DType::kF32;
  st->dtype = TorchType(dtype);

  // The module's parameters in registration order, each once (tied weights: the first name).
  std::map<const void*, int> by_impl;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const torch::Tensor& t = item.value();
    if (by_impl.count(t.unsafeGetTensorImpl())) continue;
    if (!t.device().is_cpu() || t.scalar_type() != torch::kFloat32 || t.is_sparse()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TorchOptimizer::Create: parameter ", item.key(), " is ", std::string(t.toString()), " on ", t.device().str(),
          "; zero/torch.h takes dense float32 CPU parameters (fp16/bf16 in the config make them 16-bit views over an "
          "fp32 master; the CUDA engine under libtorch is not built yet)"));
    }
    if (t.numel() == 0) {
      return absl::InvalidArgumentError(absl::StrCat("TorchOptimizer::Create: parameter ", item.key(),
                                                     " has no elements (shape ", ShapeText(t.sizes()),
                                                     "); zero shards parameters of at least one element"));
    }
    by_impl[t.unsafeGetTensorImpl()] = static_cast<int>(st->params.size());
    State::Param p;
    p.name = item.key();
    p.tensor = t;
    p.shape.assign(t.sizes().begin(), t.sizes().end());
    p.trainable = false;  // until a group names it
    st->params.push_back(std::move(p));
  }
  if (st->params.empty()) return absl::InvalidArgumentError("TorchOptimizer::Create: the module has no parameters");

  // Groups: each tensor must be one of the module's parameters, in one group at most.
  const OptimizerConfig opt_cfg = config.optimizer.value_or(OptimizerConfig{});
  std::vector<int> group_of(st->params.size(), -1);
  std::vector<ParamGroup> zero_groups;
  for (size_t g = 0; g < groups.size(); ++g) {
    ZERO_ASSIGN_OR_RETURN(ParamGroup pg, GroupFromTorch(opt_cfg, groups[g], g));
    std::vector<std::string> names;
    for (const torch::Tensor& t : groups[g].params()) {
      auto it = by_impl.find(t.unsafeGetTensorImpl());
      if (it == by_impl.end()) {
        return absl::InvalidArgumentError(absl::StrCat("TorchOptimizer::Create: param group ", g,
                                                       " holds a tensor of "
                                                       "shape ",
                                                       ShapeText(t.sizes()), " that is not a parameter of the module"));
      }
      if (group_of[it->second] >= 0) {
        return absl::InvalidArgumentError(absl::StrCat("TorchOptimizer::Create: parameter ",
                                                       st->params[it->second].name, " is in param groups ",
                                                       group_of[it->second], " and ", g));
      }
      group_of[it->second] = static_cast<int>(g);
      State::Param& p = st->params[it->second];
      p.trainable = p.tensor.requires_grad();
      if (p.trainable) names.push_back(p.name);
    }
    if (names.empty() || !groups[g].has_options()) continue;  // no options: the config's optimizer as it is
    pg.match = absl::StrJoin(names, "|");
    zero_groups.push_back(std::move(pg));
  }
  for (const State::Param& p : st->params) {
    if (p.name.find_first_of("*?|") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("TorchOptimizer::Create: parameter name ", p.name,
                                                     " holds a character of zero's name patterns (* ? |)"));
    }
  }

  // Buckets: trainable parameters in reverse registration order (backward's), up to reduce_bucket_size elements;
  // frozen ones after, in buckets of their own.
  const int world = comm->world_size();
  const int64_t cap = std::max<int64_t>(1, config.zero.reduce_bucket_size);
  std::vector<std::vector<int>> trainable_buckets, frozen_buckets;
  auto fill = [&](std::vector<std::vector<int>>& out, bool trainable) {
    int64_t in_bucket = 0;
    for (int i = static_cast<int>(st->params.size()) - 1; i >= 0; --i) {
      if (st->params[i].trainable != trainable) continue;
      const int64_t n = State::Numel(st->params[i]);
      if (out.empty() || (in_bucket > 0 && in_bucket + n > cap)) {
        out.emplace_back();
        in_bucket = 0;
      }
      out.back().push_back(i);
      in_bucket += n;
    }
  };
  fill(trainable_buckets, true);
  fill(frozen_buckets, false);
  std::vector<FlatBuffers> flat;
  std::vector<std::string> frozen_names;
  auto add_bucket = [&](const std::vector<int>& members, bool frozen) {
    const int bi = static_cast<int>(st->buckets.size());
    State::Bucket b;
    b.members = members;
    b.frozen = frozen;
    int64_t numel = 0;
    FlatBuffers fb;
    fb.bare_names = true;
    fb.dtype = dtype;
    fb.name = absl::StrCat(frozen ? "frozen bucket " : "bucket ", bi);
    for (int i : members) {
      st->params[i].bucket = bi;
      st->params[i].offset = numel;
      std::vector<int64_t> shape = st->params[i].shape;
      if (shape.empty()) shape = {1};  // a 0-dim parameter: one element
      fb.tensors.push_back({st->params[i].name, shape});
      numel += State::Numel(st->params[i]);
      if (frozen) frozen_names.push_back(st->params[i].name);
    }
    fb.capacity = ShardedOptimizer::Capacity(numel, world);
    b.params = torch::zeros({fb.capacity}, torch::TensorOptions().dtype(st->dtype));
    fb.params = b.params.data_ptr();
    if (!frozen) {
      b.grads = torch::zeros({fb.capacity}, torch::TensorOptions().dtype(st->dtype));
      fb.grads = b.grads.data_ptr();
    }
    st->buckets.push_back(std::move(b));
    flat.push_back(std::move(fb));
  };
  try {
    for (const auto& m : trainable_buckets) add_bucket(m, false);
    for (const auto& m : frozen_buckets) add_bucket(m, true);
  } catch (const c10::Error& e) {  // the buckets' allocation (CPU allocator: out of memory)
    return absl::ResourceExhaustedError(
        absl::StrCat("TorchOptimizer::Create: allocating the buckets: ", e.what_without_backtrace()));
  }
  if (!frozen_names.empty()) zero_groups.push_back({.match = absl::StrJoin(frozen_names, "|"), .frozen = true});
  for (ParamGroup& g : options.engine.param_groups) zero_groups.push_back(std::move(g));
  options.engine.param_groups = std::move(zero_groups);

  // The module's tensors become views of the buckets, holding their values: Create's agreement on rank 0's
  // values then writes through them.
  ZERO_RETURN_IF_ERROR(st->Attach(/*copy_values=*/true));
  // Overlap needs the engine to leave a handed-over reduction in flight: with overlap_comm off (DeepSpeed's default
  // at stages 0-2) it waits for each as it is issued, so every hook would block backward (measured: slower than
  // reducing at step()). TorchOptions::overlap decides it here.
  Config cfg = config;
  if (options.overlap) cfg.zero.overlap_comm = true;
  StatusOr<std::unique_ptr<ShardedOptimizer>> opt =
      ShardedOptimizer::Create(cfg, std::move(comm), std::move(flat), std::move(options.engine));
  if (!opt.ok()) return opt.status();
  st->opt = std::move(*opt);
  st->ResetPending();
  st->AddHooks();
  return std::unique_ptr<TorchOptimizer>(new TorchOptimizer(std::move(st)));
}

TorchOptimizer::TorchOptimizer(std::unique_ptr<State> state) : state_(std::move(state)) {}
TorchOptimizer::~TorchOptimizer() {
  if (state_) state_->RemoveHooks();
}

StatusOr<StepResult> TorchOptimizer::step(std::optional<double> lr) {
  State& st = *state_;
  if (!st.hook_error.ok()) {  // found in backward: no bucket was handed over after it
    Status e = st.hook_error;
    st.hook_error = absl::OkStatus();
    st.ResetPending();
    return e;
  }
  if (Status s = st.CheckViews(); !s.ok()) {
    // Moved after backward: buckets already handed over stay so (their reductions finish at the next step(),
    // after reload()); the rest are reduced then.
    bool any_handed = false;
    for (const State::Bucket& b : st.buckets) any_handed = any_handed || b.handed;
    if (!any_handed) st.ResetPending();
    return s;
  }
  StepOptions o;
  o.lr = lr;
  StatusOr<StepResult> r = st.opt->Step(o);
  st.ResetPending();
  return r;
}

void TorchOptimizer::zero_grad() {
  State& st = *state_;
  torch::NoGradGuard no_grad;
  for (State::Bucket& b : st.buckets) {
    if (b.grads.defined()) b.grads.zero_();
  }
  // A gradient set to none (module->zero_grad(true) before this) is a view again; one assigned elsewhere is left
  // for step() to report.
  for (State::Param& p : st.params) {
    if (p.trainable && !p.tensor.grad().defined()) p.tensor.mutable_grad() = st.GradView(p);
  }
}

Status TorchOptimizer::reload() {
  State& st = *state_;
  for (const State::Param& p : st.params) {
    if (!p.tensor.defined()) {
      return absl::FailedPreconditionError(absl::StrCat("TorchOptimizer::reload: parameter ", p.name, " is undefined"));
    }
  }
  ZERO_RETURN_IF_ERROR(st.Attach(/*copy_values=*/true));
  // set_data with another dtype or device resets a parameter's gradient accumulator: hook the current ones.
  st.AddHooks();
  for (size_t b = 0; b < st.buckets.size(); ++b) ZERO_RETURN_IF_ERROR(st.opt->ReloadParams(static_cast<int>(b)));
  return absl::OkStatus();
}

TorchNoSync::TorchNoSync(TorchOptimizer* opt) : opt_(opt) { ++opt_->state_->no_sync; }
TorchNoSync::~TorchNoSync() { --opt_->state_->no_sync; }
TorchNoSync TorchOptimizer::no_sync() { return TorchNoSync(this); }

StatusOr<std::string> TorchOptimizer::Save(const std::string& dir, const SaveOptions& options) {
  ZERO_RETURN_IF_ERROR(state_->CheckViews());
  return state_->opt->Save(dir, options);
}
StatusOr<LoadResult> TorchOptimizer::Load(const std::string& dir, const LoadOptions& options) {
  ZERO_RETURN_IF_ERROR(state_->CheckViews());
  return state_->opt->Load(dir, options);
}
MemoryReport TorchOptimizer::memory_report() const { return state_->opt->memory_report(); }
int64_t TorchOptimizer::trainer_bytes() const { return state_->opt->trainer_bytes(); }
std::vector<std::vector<std::string>> TorchOptimizer::buckets() const {
  std::vector<std::vector<std::string>> out;
  for (const State::Bucket& b : state_->buckets) {
    out.emplace_back();
    for (int i : b.members) out.back().push_back(state_->params[i].name);
  }
  return out;
}
int64_t TorchOptimizer::steps() const { return state_->opt->steps(); }
double TorchOptimizer::loss_scale() const { return state_->opt->loss_scale(); }
int TorchOptimizer::rank() const { return state_->opt->rank(); }
int TorchOptimizer::world_size() const { return state_->opt->world_size(); }

}  // namespace zero
