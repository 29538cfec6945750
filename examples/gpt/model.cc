// The reference GPT: parameter specs and deterministic init, views over flat unit buffers, activation memory,
// the five phases (embedding / block / head forward and backward), and the whole-model GptModel.
#include "gpt/model.h"

#include <cblas.h>

#include <array>
#include <cmath>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gpt/ops.h"

namespace zero::gpt {
namespace {

// ---- counter-based random numbers for the init -----------------------------------------------------------

// splitmix64's finalizer: a bijective 64-bit mix with good avalanche, used as a stateless hash.
uint64_t Mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Folds a string into a running hash (FNV-1a over the bytes plus a terminator, so "ab"+"c" != "a"+"bc").
uint64_t HashString(uint64_t h, const std::string& s) {
  h ^= 0xCBF29CE484222325ULL;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001B3ULL;
  h = (h ^ 0xFF) * 0x100000001B3ULL;
  return Mix64(h);
}

// The i-th standard normal of stream `key`: Box-Muller on two uniforms hashed from (key, i). Stateless, so
// any slice of a parameter can be generated on its own.
double NormalAt(uint64_t key, int64_t i) {
  const uint64_t h1 = Mix64(key ^ Mix64(2 * static_cast<uint64_t>(i)));
  const uint64_t h2 = Mix64(key ^ Mix64(2 * static_cast<uint64_t>(i) + 1));
  const double u1 = (static_cast<double>(h1 >> 11) + 0.5) * 0x1.0p-53;  // (0, 1): log is finite
  const double u2 = static_cast<double>(h2 >> 11) * 0x1.0p-53;          // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

bool EndsWith(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// ---- views from specs ------------------------------------------------------------------------------------

// Member lists in packing order; they must match RootParams / BlockParams (checked by the tests and, for the
// names, by kRootNames / kBlockNames below being the single source of both).
constexpr std::array<const char*, 4> kRootNames = {"wte", "wpe", "lnf_w", "lnf_b"};
constexpr std::array<const char*, 12> kBlockNames = {"ln1_w", "ln1_b", "qkv_w", "qkv_b", "attn_proj_w", "attn_proj_b",
                                                     "ln2_w", "ln2_b", "fc_w",  "fc_b",  "fc_proj_w",   "fc_proj_b"};

template <typename T>
std::array<T**, 4> RootMembers(RootView<T>& v) {
  return {&v.wte, &v.wpe, &v.lnf_w, &v.lnf_b};
}

template <typename T>
std::array<T**, 12> BlockMembers(BlockView<T>& v) {
  return {&v.ln1_w, &v.ln1_b, &v.qkv_w, &v.qkv_b, &v.attn_proj_w, &v.attn_proj_b,
          &v.ln2_w, &v.ln2_b, &v.fc_w,  &v.fc_b,  &v.fc_proj_w,   &v.fc_proj_b};
}

template <typename View, typename T, typename Members>
View ViewFromFlat(const std::vector<ParamSpec>& specs, T* base, Members members_of) {
  View view;
  auto members = members_of(view);
  ZERO_CHECK_EQ(members.size(), specs.size());
  int64_t offset = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    *members[i] = base + offset;
    offset += specs[i].numel();
  }
  return view;
}

template <typename View, typename Names, typename Members>
absl::StatusOr<View> ViewFromLookup(const ParamLookup& lookup, const Names& names, Members members_of) {
  View view;
  auto members = members_of(view);
  for (size_t i = 0; i < names.size(); ++i) {
    float* p = lookup(names[i]);
    if (p == nullptr) return absl::NotFoundError(absl::StrCat("GPT parameter view: no pointer for '", names[i], "'"));
    *members[i] = p;
  }
  return view;
}

// ---- activation memory -----------------------------------------------------------------------------------

constexpr size_t kAlign = 64;

size_t RoundUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Hands out consecutive 64-byte-aligned views of one block; with a null base it only measures.
class Carver {
 public:
  explicit Carver(std::byte* base) : base_(base) {}
  template <typename T>
  T* Take(int64_t n) {
    T* p = base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + offset_);
    offset_ += RoundUp(static_cast<size_t>(n) * sizeof(T));
    return p;
  }
  size_t bytes() const { return offset_; }

 private:
  std::byte* base_;
  size_t offset_ = 0;
};

void CarveBlockActs(const GptConfig& cfg, int B, int T, Carver& c, BlockActs* a) {
  const int64_t N = static_cast<int64_t>(B) * T;
  const int64_t C = cfg.channels;
  a->B = B;
  a->T = T;
  a->x_in = c.Take<float>(N * C);
  a->ln1 = c.Take<float>(N * C);
  a->ln1_mean = c.Take<float>(N);
  a->ln1_rstd = c.Take<float>(N);
  a->qkv = c.Take<float>(N * 3 * C);
  a->att = c.Take<float>(static_cast<int64_t>(B) * cfg.heads * T * T);
  a->atty = c.Take<float>(N * C);
  a->residual2 = c.Take<float>(N * C);
  a->ln2 = c.Take<float>(N * C);
  a->ln2_mean = c.Take<float>(N);
  a->ln2_rstd = c.Take<float>(N);
  a->fch = c.Take<float>(N * 4 * C);
  a->fch_gelu = c.Take<float>(N * 4 * C);
}

void CarveScratch(const GptConfig& cfg, int B, int T, Carver& c, BlockScratch* s) {
  const int64_t N = static_cast<int64_t>(B) * T;
  const int64_t C = cfg.channels;
  s->B = B;
  s->T = T;
  s->dln = c.Take<float>(N * C);
  s->dqkv = c.Take<float>(N * 3 * C);
  s->dfch = c.Take<float>(N * 4 * C);
  s->datt = c.Take<float>(static_cast<int64_t>(T) * T);
}

void CarveHeadActs(const GptConfig& cfg, int B, int T, Carver& c, HeadActs* h) {
  const int64_t N = static_cast<int64_t>(B) * T;
  const int64_t C = cfg.channels;
  h->B = B;
  h->T = T;
  h->x_in = c.Take<float>(N * C);
  h->lnf = c.Take<float>(N * C);
  h->lnf_mean = c.Take<float>(N);
  h->lnf_rstd = c.Take<float>(N);
  h->probs = c.Take<float>(N * cfg.vocab);
  h->dlnf = c.Take<float>(N * C);
  h->targets = c.Take<int32_t>(N);
}

template <typename Acts, typename CarveFn>
size_t MeasureActs(const GptConfig& cfg, int B, int T, CarveFn carve) {
  Acts dummy;
  Carver c(nullptr);
  carve(cfg, B, T, c, &dummy);
  return c.bytes();
}

// Allocates `bytes` + slack and returns the first 64-byte-aligned address inside.
std::byte* AllocateAligned(size_t bytes, std::unique_ptr<std::byte[]>* owned) {
  *owned = std::make_unique<std::byte[]>(bytes + kAlign);
  const auto addr = reinterpret_cast<uintptr_t>(owned->get());
  return owned->get() + (RoundUp(addr) - addr);
}

void CheckBound(void* memory) {
  ZERO_CHECK(memory != nullptr);
  ZERO_CHECK_EQ(reinterpret_cast<uintptr_t>(memory) % kAlign, 0u) << "activation memory must be 64-byte aligned";
}

// Allocate / Bind of the three activation structs: carve the views out of owned or caller memory.
template <typename Acts, typename CarveFn>
std::unique_ptr<std::byte[]> AllocateCarved(const GptConfig& cfg, int B, int T, CarveFn carve, Acts* acts) {
  std::unique_ptr<std::byte[]> owned;
  Carver c(AllocateAligned(MeasureActs<Acts>(cfg, B, T, carve), &owned));
  carve(cfg, B, T, c, acts);
  return owned;
}

template <typename Acts, typename CarveFn>
void BindCarved(const GptConfig& cfg, int B, int T, void* memory, CarveFn carve, Acts* acts) {
  CheckBound(memory);
  Carver c(static_cast<std::byte*>(memory));
  carve(cfg, B, T, c, acts);
}

void CheckShape(const GptConfig& cfg, int B, int T) {
  ZERO_CHECK_GE(B, 1);
  ZERO_CHECK(T >= 1 && T <= cfg.max_seq) << "T " << T << " outside [1, " << cfg.max_seq << "]";
}

void CheckIds(const int32_t* ids, int64_t n, int vocab, const char* what) {
  for (int64_t i = 0; i < n; ++i)
    ZERO_CHECK(ids[i] >= 0 && ids[i] < vocab)
        << what << "[" << i << "] = " << ids[i] << " outside [0, " << vocab << ")";
}

}  // namespace

// ---- configuration ---------------------------------------------------------------------------------------

GptConfig GptConfig::Tiny() { return GptConfig{.vocab = 256, .max_seq = 32, .layers = 2, .heads = 2, .channels = 64}; }

GptConfig GptConfig::Small() {
  return GptConfig{.vocab = 256, .max_seq = 128, .layers = 6, .heads = 6, .channels = 384};
}

absl::StatusOr<GptConfig> GptConfig::FromName(const std::string& name) {
  if (name == "tiny") return Tiny();
  if (name == "small") return Small();
  return absl::InvalidArgumentError(absl::StrCat("model '", name, "' is not one of: tiny, small"));
}

absl::Status ValidateConfig(const GptConfig& cfg) {
  const std::pair<const char*, int> fields[] = {{"vocab", cfg.vocab},
                                                {"max_seq", cfg.max_seq},
                                                {"layers", cfg.layers},
                                                {"heads", cfg.heads},
                                                {"channels", cfg.channels}};
  for (const auto& [name, value] : fields) {
    if (value < 1) return absl::InvalidArgumentError(absl::StrCat("GptConfig.", name, " = ", value, " must be >= 1"));
  }
  if (cfg.channels % cfg.heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GptConfig.heads = ", cfg.heads, " must divide GptConfig.channels = ", cfg.channels));
  }
  return absl::OkStatus();
}

// ---- parameters and units --------------------------------------------------------------------------------

int64_t ParamSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string BlockUnitName(int layer) { return absl::StrCat("h.", layer); }

std::vector<ParamSpec> RootParams(const GptConfig& cfg) {
  const int64_t C = cfg.channels;
  return {
      {kRootNames[0], {cfg.vocab, C}}, {kRootNames[1], {cfg.max_seq, C}}, {kRootNames[2], {C}}, {kRootNames[3], {C}}};
}

std::vector<ParamSpec> BlockParams(const GptConfig& cfg) {
  const int64_t C = cfg.channels;
  const std::array<std::vector<int64_t>, 12> shapes = {
      std::vector<int64_t>{C}, {C}, {C, 3 * C}, {3 * C}, {C, C}, {C}, {C}, {C}, {C, 4 * C}, {4 * C}, {4 * C, C}, {C}};
  std::vector<ParamSpec> specs;
  for (size_t i = 0; i < shapes.size(); ++i) specs.push_back({kBlockNames[i], shapes[i]});
  return specs;
}

int64_t UnitNumel(const std::vector<ParamSpec>& specs) {
  int64_t n = 0;
  for (const auto& s : specs) n += s.numel();
  return n;
}

int64_t NumParams(const GptConfig& cfg) {
  return UnitNumel(RootParams(cfg)) + static_cast<int64_t>(cfg.layers) * UnitNumel(BlockParams(cfg));
}

absl::Status InitParamSlice(uint64_t seed, const GptConfig& cfg, const std::string& unit, const ParamSpec& spec,
                            int64_t begin, int64_t count, float* out) {
  std::vector<ParamSpec> specs;
  if (unit == kRootUnit) {
    specs = RootParams(cfg);
  } else {
    int layer = -1;
    if (unit.rfind("h.", 0) != 0 || !absl::SimpleAtoi(unit.substr(2), &layer) || layer < 0 || layer >= cfg.layers ||
        BlockUnitName(layer) != unit) {
      return absl::InvalidArgumentError(
          absl::StrCat("GPT init: unit '", unit, "' is neither 'root' nor 'h.<i>' with i < ", cfg.layers));
    }
    specs = BlockParams(cfg);
  }
  const ParamSpec* match = nullptr;
  for (const auto& s : specs) {
    if (s.name == spec.name) match = &s;
  }
  if (match == nullptr || match->shape != spec.shape) {
    return absl::InvalidArgumentError(absl::StrCat("GPT init: unit '", unit, "' has no parameter '", spec.name,
                                                   "' of shape [", absl::StrJoin(spec.shape, ", "), "]"));
  }
  if (begin < 0 || count < 0 || begin + count > spec.numel()) {
    return absl::OutOfRangeError(absl::StrCat("GPT init: slice [", begin, ", ", begin + count, ") of ", unit, ".",
                                              spec.name, " exceeds its ", spec.numel(), " elements"));
  }
  const std::string& name = spec.name;
  if (EndsWith(name, "_b")) {
    std::fill(out, out + count, 0.0f);
    return absl::OkStatus();
  }
  if (name.rfind("ln", 0) == 0) {  // ln1_w, ln2_w, lnf_w
    std::fill(out, out + count, 1.0f);
    return absl::OkStatus();
  }
  // GPT-2 scales the weights of the projections that write into the residual stream by 1/sqrt(2 * layers)
  // (two per block), so the stream's variance does not grow with depth.
  double std_dev = 0.02;
  if (name == "attn_proj_w" || name == "fc_proj_w") std_dev /= std::sqrt(2.0 * cfg.layers);
  const uint64_t key = HashString(HashString(Mix64(seed), unit), name);
  for (int64_t i = 0; i < count; ++i) out[i] = static_cast<float>(std_dev * NormalAt(key, begin + i));
  return absl::OkStatus();
}

absl::Status InitParam(uint64_t seed, const GptConfig& cfg, const std::string& unit, const ParamSpec& spec,
                       float* out) {
  return InitParamSlice(seed, cfg, unit, spec, 0, spec.numel(), out);
}

// ---- parameter views -------------------------------------------------------------------------------------

RootWeights RootWeightsFromFlat(const GptConfig& cfg, const float* base) {
  return ViewFromFlat<RootWeights>(RootParams(cfg), base, RootMembers<const float>);
}
RootGrads RootGradsFromFlat(const GptConfig& cfg, float* base) {
  return ViewFromFlat<RootGrads>(RootParams(cfg), base, RootMembers<float>);
}
BlockWeights BlockWeightsFromFlat(const GptConfig& cfg, const float* base) {
  return ViewFromFlat<BlockWeights>(BlockParams(cfg), base, BlockMembers<const float>);
}
BlockGrads BlockGradsFromFlat(const GptConfig& cfg, float* base) {
  return ViewFromFlat<BlockGrads>(BlockParams(cfg), base, BlockMembers<float>);
}

absl::StatusOr<RootWeights> RootWeightsFromLookup(const ParamLookup& lookup) {
  return ViewFromLookup<RootWeights>(lookup, kRootNames, RootMembers<const float>);
}
absl::StatusOr<RootGrads> RootGradsFromLookup(const ParamLookup& lookup) {
  return ViewFromLookup<RootGrads>(lookup, kRootNames, RootMembers<float>);
}
absl::StatusOr<BlockWeights> BlockWeightsFromLookup(const ParamLookup& lookup) {
  return ViewFromLookup<BlockWeights>(lookup, kBlockNames, BlockMembers<const float>);
}
absl::StatusOr<BlockGrads> BlockGradsFromLookup(const ParamLookup& lookup) {
  return ViewFromLookup<BlockGrads>(lookup, kBlockNames, BlockMembers<float>);
}

// ---- activations -----------------------------------------------------------------------------------------

size_t BlockActs::Bytes(const GptConfig& cfg, int B, int T) {
  return MeasureActs<BlockActs>(cfg, B, T, CarveBlockActs);
}

void BlockActs::Allocate(const GptConfig& cfg, int B, int T) {
  owned_ = AllocateCarved(cfg, B, T, CarveBlockActs, this);
}

void BlockActs::Bind(const GptConfig& cfg, int B, int T, void* memory) {
  BindCarved(cfg, B, T, memory, CarveBlockActs, this);
  owned_.reset();
}

size_t BlockActivationBytes(const GptConfig& cfg, int B, int T) { return BlockActs::Bytes(cfg, B, T); }

size_t BlockScratch::Bytes(const GptConfig& cfg, int B, int T) {
  return MeasureActs<BlockScratch>(cfg, B, T, CarveScratch);
}

void BlockScratch::Allocate(const GptConfig& cfg, int B, int T) {
  owned_ = AllocateCarved(cfg, B, T, CarveScratch, this);
}

void BlockScratch::Bind(const GptConfig& cfg, int B, int T, void* memory) {
  BindCarved(cfg, B, T, memory, CarveScratch, this);
  owned_.reset();
}

size_t HeadActs::Bytes(const GptConfig& cfg, int B, int T) { return MeasureActs<HeadActs>(cfg, B, T, CarveHeadActs); }

void HeadActs::Allocate(const GptConfig& cfg, int B, int T) { owned_ = AllocateCarved(cfg, B, T, CarveHeadActs, this); }

void HeadActs::Bind(const GptConfig& cfg, int B, int T, void* memory) {
  BindCarved(cfg, B, T, memory, CarveHeadActs, this);
  owned_.reset();
}

// ---- phases ----------------------------------------------------------------------------------------------

void EmbeddingForward(const GptConfig& cfg, const RootWeights& w, const int32_t* tokens, int B, int T, float* x_out) {
  CheckShape(cfg, B, T);
  CheckIds(tokens, static_cast<int64_t>(B) * T, cfg.vocab, "tokens");
  const int64_t C = cfg.channels;
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const int64_t row = static_cast<int64_t>(b) * T + t;
      const float* te = w.wte + static_cast<int64_t>(tokens[row]) * C;
      const float* pe = w.wpe + static_cast<int64_t>(t) * C;
      float* out = x_out + row * C;
      for (int64_t i = 0; i < C; ++i) out[i] = te[i] + pe[i];
    }
  }
}

void BlockForward(const GptConfig& cfg, const BlockWeights& w, const float* x_in, float* x_out, BlockActs* acts) {
  ZERO_CHECK(acts != nullptr && acts->x_in != nullptr) << "BlockForward needs allocated BlockActs";
  const int B = acts->B;
  const int T = acts->T;
  CheckShape(cfg, B, T);
  const int64_t N = static_cast<int64_t>(B) * T;
  const int64_t C = cfg.channels;
  // Keep a copy of the input: layernorm 1's backward needs it, and the copy lets x_out alias x_in.
  if (acts->x_in != x_in) std::memcpy(acts->x_in, x_in, sizeof(float) * N * C);
  const float* x = acts->x_in;
  ops::LayerNormForward(x, w.ln1_w, w.ln1_b, N, C, acts->ln1, acts->ln1_mean, acts->ln1_rstd);
  ops::MatmulForward(acts->ln1, w.qkv_w, w.qkv_b, N, C, 3 * C, acts->qkv);
  ops::AttentionForward(acts->qkv, B, T, cfg.channels, cfg.heads, acts->att, acts->atty);
  ops::MatmulForward(acts->atty, w.attn_proj_w, w.attn_proj_b, N, C, C, acts->residual2);
  ops::ResidualForward(acts->residual2, x, N * C, acts->residual2);
  ops::LayerNormForward(acts->residual2, w.ln2_w, w.ln2_b, N, C, acts->ln2, acts->ln2_mean, acts->ln2_rstd);
  ops::MatmulForward(acts->ln2, w.fc_w, w.fc_b, N, C, 4 * C, acts->fch);
  ops::GeluForward(acts->fch, N * 4 * C, acts->fch_gelu);
  ops::MatmulForward(acts->fch_gelu, w.fc_proj_w, w.fc_proj_b, N, 4 * C, C, x_out);
  ops::ResidualForward(x_out, acts->residual2, N * C, x_out);
}

float HeadForward(const GptConfig& cfg, const RootWeights& w, const float* x, const int32_t* targets, HeadActs* acts) {
  ZERO_CHECK(acts != nullptr && acts->x_in != nullptr) << "HeadForward needs allocated HeadActs";
  const int B = acts->B;
  const int T = acts->T;
  CheckShape(cfg, B, T);
  const int64_t N = static_cast<int64_t>(B) * T;
  const int64_t C = cfg.channels;
  CheckIds(targets, N, cfg.vocab, "targets");
  if (acts->x_in != x) std::memcpy(acts->x_in, x, sizeof(float) * N * C);
  std::memcpy(acts->targets, targets, sizeof(int32_t) * N);
  ops::LayerNormForward(acts->x_in, w.lnf_w, w.lnf_b, N, C, acts->lnf, acts->lnf_mean, acts->lnf_rstd);
  ops::TiedHeadForward(acts->lnf, w.wte, N, C, cfg.vocab, acts->probs);
  return ops::SoftmaxCrossEntropyForward(acts->probs, acts->targets, N, cfg.vocab, acts->probs);
}

void HeadBackward(const GptConfig& cfg, const RootWeights& w, const RootGrads& g, HeadActs* acts, float* dx) {
  ZERO_CHECK(acts != nullptr && acts->x_in != nullptr) << "HeadBackward needs the HeadActs of HeadForward";
  const int64_t N = static_cast<int64_t>(acts->B) * acts->T;
  const int64_t C = cfg.channels;
  float* dlogits = acts->probs;  // in place: probs are not needed after this
  ops::SoftmaxCrossEntropyBackward(acts->probs, acts->targets, N, cfg.vocab, dlogits);
  ops::TiedHeadBackward(dlogits, acts->lnf, w.wte, N, C, cfg.vocab, acts->dlnf, g.wte);
  std::memset(dx, 0, sizeof(float) * N * C);  // layernorm backward accumulates
  ops::LayerNormBackward(acts->dlnf, acts->x_in, w.lnf_w, acts->lnf_mean, acts->lnf_rstd, N, C, dx, g.lnf_w, g.lnf_b);
}

void BlockBackward(const GptConfig& cfg, const BlockWeights& w, const BlockGrads& g, const BlockActs& acts,
                   const float* dx_out, float* dx_in, BlockScratch* scratch) {
  ZERO_CHECK(scratch != nullptr && scratch->dln != nullptr) << "BlockBackward needs allocated BlockScratch";
  ZERO_CHECK(scratch->B == acts.B && scratch->T == acts.T)
      << "scratch for (B, T) = (" << scratch->B << ", " << scratch->T << ") used with acts for (" << acts.B << ", "
      << acts.T << ")";
  const int B = acts.B;
  const int T = acts.T;
  const int64_t N = static_cast<int64_t>(B) * T;
  const int64_t C = cfg.channels;
  // dx_in doubles as the gradient of the residual stream: it starts as dL/dout (the skip connections pass it
  // through unchanged) and each branch's layernorm backward adds its contribution.
  float* dres = dx_in;
  if (dx_in != dx_out) std::memcpy(dres, dx_out, sizeof(float) * N * C);
  // MLP branch: out = r + fc_proj(gelu(fc(ln2(r)))).
  ops::MatmulBackward(dres, acts.fch_gelu, w.fc_proj_w, N, 4 * C, C, scratch->dfch, g.fc_proj_w, g.fc_proj_b);
  ops::GeluBackward(scratch->dfch, acts.fch, N * 4 * C, scratch->dfch);
  ops::MatmulBackward(scratch->dfch, acts.ln2, w.fc_w, N, C, 4 * C, scratch->dln, g.fc_w, g.fc_b);
  ops::LayerNormBackward(scratch->dln, acts.residual2, w.ln2_w, acts.ln2_mean, acts.ln2_rstd, N, C, dres, g.ln2_w,
                         g.ln2_b);
  // Attention branch: r = x + proj(attn(qkv(ln1(x)))). dln holds d(atty) first, then d(ln1).
  ops::MatmulBackward(dres, acts.atty, w.attn_proj_w, N, C, C, scratch->dln, g.attn_proj_w, g.attn_proj_b);
  ops::AttentionBackward(scratch->dln, acts.qkv, acts.att, B, T, cfg.channels, cfg.heads, scratch->dqkv, scratch->datt);
  ops::MatmulBackward(scratch->dqkv, acts.ln1, w.qkv_w, N, C, 3 * C, scratch->dln, g.qkv_w, g.qkv_b);
  ops::LayerNormBackward(scratch->dln, acts.x_in, w.ln1_w, acts.ln1_mean, acts.ln1_rstd, N, C, dres, g.ln1_w, g.ln1_b);
}

void EmbeddingBackward(const GptConfig& cfg, const RootGrads& g, const int32_t* tokens, int B, int T, const float* dx) {
  CheckShape(cfg, B, T);
  CheckIds(tokens, static_cast<int64_t>(B) * T, cfg.vocab, "tokens");
  const int64_t C = cfg.channels;
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const int64_t row = static_cast<int64_t>(b) * T + t;
      const float* d = dx + row * C;
      float* dte = g.wte + static_cast<int64_t>(tokens[row]) * C;
      float* dpe = g.wpe + static_cast<int64_t>(t) * C;
      for (int64_t i = 0; i < C; ++i) {
        dte[i] += d[i];
        dpe[i] += d[i];
      }
    }
  }
}

// ---- BLAS threads ----------------------------------------------------------------------------------------

void SetBlasThreads(int n) {
  ZERO_CHECK_GE(n, 1);
  openblas_set_num_threads(n);
}

int BlasThreads() { return openblas_get_num_threads(); }

std::string BlasCoreName() {
  const char* name = openblas_get_corename();
  return name == nullptr ? std::string() : std::string(name);
}

// ---- GptModel --------------------------------------------------------------------------------------------

absl::StatusOr<GptModel> GptModel::Create(const GptConfig& cfg, uint64_t seed) {
  ZERO_RETURN_IF_ERROR(ValidateConfig(cfg));
  GptModel m;
  m.cfg_ = cfg;
  m.unit_names_.push_back(kRootUnit);
  for (int l = 0; l < cfg.layers; ++l) m.unit_names_.push_back(BlockUnitName(l));
  m.unit_offset_.push_back(0);
  for (int u = 0; u < m.num_units(); ++u) {
    const auto specs = u == 0 ? RootParams(cfg) : BlockParams(cfg);
    m.unit_offset_.push_back(m.unit_offset_.back() + UnitNumel(specs));
  }
  m.params_.assign(m.unit_offset_.back(), 0.0f);
  m.grads_.assign(m.unit_offset_.back(), 0.0f);
  for (int u = 0; u < m.num_units(); ++u) {
    const auto specs = u == 0 ? RootParams(cfg) : BlockParams(cfg);
    float* p = m.params(u);
    for (const auto& spec : specs) {
      ZERO_RETURN_IF_ERROR(InitParam(seed, cfg, m.unit_names_[u], spec, p));
      p += spec.numel();
    }
  }
  return m;
}

absl::StatusOr<float*> GptModel::Param(const std::string& unit, const std::string& name) {
  for (int u = 0; u < num_units(); ++u) {
    if (unit_names_[u] != unit) continue;
    int64_t offset = unit_offset_[u];
    for (const auto& spec : u == 0 ? RootParams(cfg_) : BlockParams(cfg_)) {
      if (spec.name == name) return params_.data() + offset;
      offset += spec.numel();
    }
    return absl::NotFoundError(absl::StrCat("GPT unit '", unit, "' has no parameter '", name, "'"));
  }
  return absl::NotFoundError(absl::StrCat("GPT model has no unit '", unit, "'"));
}

absl::StatusOr<float*> GptModel::Grad(const std::string& unit, const std::string& name) {
  ZERO_ASSIGN_OR_RETURN(float* p, Param(unit, name));
  return grads_.data() + (p - params_.data());
}

void GptModel::ZeroGrads() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

absl::Status GptModel::Validate(const int32_t* tokens, const int32_t* targets, int B, int T) const {
  if (B < 1) return absl::InvalidArgumentError(absl::StrCat("GPT batch size B = ", B, " must be >= 1"));
  if (T < 1 || T > cfg_.max_seq) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPT sequence length T = ", T, " outside [1, max_seq = ", cfg_.max_seq, "]"));
  }
  const int64_t N = static_cast<int64_t>(B) * T;
  for (const auto& [ids, what] : {std::pair{tokens, "tokens"}, std::pair{targets, "targets"}}) {
    for (int64_t i = 0; i < N; ++i) {
      if (ids[i] < 0 || ids[i] >= cfg_.vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("GPT ", what, "[", i, "] = ", ids[i], " outside [0, vocab = ", cfg_.vocab, ")"));
      }
    }
  }
  return absl::OkStatus();
}

void GptModel::EnsureActivations(int B, int T) {
  if (B == act_B_ && T == act_T_) return;
  block_acts_.clear();
  block_acts_.resize(cfg_.layers);
  for (auto& a : block_acts_) a.Allocate(cfg_, B, T);
  head_acts_.Allocate(cfg_, B, T);
  scratch_.Allocate(cfg_, B, T);
  x_.assign(static_cast<size_t>(B) * T * cfg_.channels, 0.0f);
  dx_.assign(x_.size(), 0.0f);
  act_B_ = B;
  act_T_ = T;
}

float GptModel::RunForward(const int32_t* tokens, const int32_t* targets) {
  const RootWeights rw = RootWeightsFromFlat(cfg_, params(0));
  EmbeddingForward(cfg_, rw, tokens, act_B_, act_T_, x_.data());
  for (int l = 0; l < cfg_.layers; ++l) {
    BlockForward(cfg_, BlockWeightsFromFlat(cfg_, params(l + 1)), x_.data(), x_.data(), &block_acts_[l]);
  }
  return HeadForward(cfg_, rw, x_.data(), targets, &head_acts_);
}

absl::StatusOr<float> GptModel::Forward(const int32_t* tokens, const int32_t* targets, int B, int T) {
  ZERO_RETURN_IF_ERROR(Validate(tokens, targets, B, T));
  EnsureActivations(B, T);
  return RunForward(tokens, targets);
}

absl::StatusOr<float> GptModel::ForwardBackward(const int32_t* tokens, const int32_t* targets, int B, int T) {
  ZERO_RETURN_IF_ERROR(Validate(tokens, targets, B, T));
  EnsureActivations(B, T);
  const float loss = RunForward(tokens, targets);
  const RootWeights rw = RootWeightsFromFlat(cfg_, params(0));
  const RootGrads rg = RootGradsFromFlat(cfg_, grads(0));
  HeadBackward(cfg_, rw, rg, &head_acts_, dx_.data());
  for (int l = cfg_.layers - 1; l >= 0; --l) {
    BlockBackward(cfg_, BlockWeightsFromFlat(cfg_, params(l + 1)), BlockGradsFromFlat(cfg_, grads(l + 1)),
                  block_acts_[l], dx_.data(), dx_.data(), &scratch_);
  }
  EmbeddingBackward(cfg_, rg, tokens, B, T, dx_.data());
  return loss;
}

size_t GptModel::activation_bytes() const {
  if (act_B_ == 0) return 0;
  return cfg_.layers * BlockActs::Bytes(cfg_, act_B_, act_T_) + HeadActs::Bytes(cfg_, act_B_, act_T_) +
         BlockScratch::Bytes(cfg_, act_B_, act_T_) + 2 * x_.size() * sizeof(float);
}

}  // namespace zero::gpt
