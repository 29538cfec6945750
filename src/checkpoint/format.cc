// checkpoint/format.cc — meta.json, rank files, and the checked reader.
#include "checkpoint/internal/format.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/internal/crc32c.h"
#include "checkpoint/internal/file.h"
#include "core/internal/json_depth.h"
#include "io/internal/io_engine.h"
#include "nlohmann/json.hpp"

namespace zero::ckpt {

std::string FullParamName(const std::string& unit, bool bare_names, const std::string& param) {
  return bare_names ? param : absl::StrCat(unit, ".", param);
}

namespace {

using json = nlohmann::json;

constexpr int64_t kMaxWorld = int64_t{1} << 20;
constexpr int64_t kMaxElems = int64_t{1} << 50;  // far above any model, far below int64 overflow in bytes

std::string Hex32(uint32_t v) { return absl::StrFormat("crc32c:%08x", v); }

json SectionsJson(const std::vector<Section>& list) {
  json sections = json::array();
  for (const Section& s : list) {
    json crcs = json::array();
    for (uint32_t c : s.crc) crcs.push_back(c);
    sections.push_back({{"unit", s.unit},
                        {"stream", s.stream},
                        {"begin", s.begin},
                        {"end", s.end},
                        {"offset", s.offset},
                        {"crc32c", crcs}});
  }
  return sections;
}

json RankJson(const RankFileMeta& r) {
  json jr = {{"file", r.file}, {"bytes", r.bytes}};
  jr["sections"] = SectionsJson(r.sections);
  if (!r.rank_state.empty()) jr["rank_state"] = SectionsJson(r.rank_state);
  json ts = json::object();
  for (const auto& [k, v] : r.trainer_state) ts[k] = absl::Base64Escape(v);
  jr["trainer_state"] = ts;
  return jr;
}

json MetaJson(const Meta& m) {
  json j;
  j["format"] = "zero-checkpoint";
  j["format_version"] = m.format_version;
  j["tag"] = m.tag;
  j["kind"] = m.kind;
  j["world_size"] = m.world_size;
  j["stage"] = m.stage;
  j["compute_dtype"] = std::string(DTypeName(m.compute_dtype));
  j["optimizer"] = m.optimizer;
  j["state_names"] = m.state_names;
  j["step"] = m.step;
  j["skipped_steps"] = m.skipped_steps;
  j["loss_scaler"] = {{"scale", m.loss_scaler.scale},
                      {"hysteresis", m.loss_scaler.hysteresis},
                      {"iteration", m.loss_scaler.iteration},
                      {"last_overflow_iteration", m.loss_scaler.last_overflow_iteration}};
  json groups = json::array();
  for (const GroupMeta& g : m.param_groups) {
    json jg = {{"match", g.match}, {"lr_scale", g.lr_scale}, {"frozen", g.frozen}};
    for (const auto& [k, v] : g.overrides) jg[k] = v;
    groups.push_back(jg);
  }
  j["param_groups"] = groups;
  json units = json::array();
  for (const UnitMeta& u : m.units) {
    json ju = {{"name", u.name}, {"numel", u.numel}, {"frozen", u.frozen}};
    if (u.bare_names) ju["bare_names"] = true;
    json streams = json::array();
    for (const StreamMeta& s : u.streams)
      streams.push_back({{"name", s.name}, {"dtype", std::string(DTypeName(s.dtype))}});
    ju["streams"] = streams;
    json params = json::array();
    for (const ParamMeta& p : u.params) {
      params.push_back({{"name", p.name}, {"shape", p.shape}, {"offset", p.offset}, {"group", p.group}});
    }
    ju["params"] = params;
    units.push_back(ju);
  }
  j["units"] = units;
  if (m.qgz) {
    j["qgz_residuals"] = {{"local", m.qgz->local},
                          {"bits", m.qgz->bits},
                          {"block", m.qgz->block},
                          {"dtype", std::string(DTypeName(m.qgz->dtype))},
                          {"residuals", m.qgz->int8 ? "int8" : "compute"},
                          {"rounds", m.qgz->rounds}};
  }
  json ranks = json::array();
  for (const RankFileMeta& r : m.ranks) ranks.push_back(RankJson(r));
  j["ranks"] = ranks;
  return j;
}

// Field access that turns every malformed input into an error naming the field (no exception escapes).
struct Parser {
  std::string what;
  Status error;
  bool Fail(const std::string& msg) {
    if (error.ok()) error = absl::DataLossError(absl::StrCat(what, ": ", msg));
    return false;
  }
  const json* Field(const json& obj, const char* key, const std::string& where) {
    if (!obj.is_object()) {
      Fail(absl::StrCat(where, " is not an object"));
      return nullptr;
    }
    auto it = obj.find(key);
    if (it == obj.end()) {
      Fail(absl::StrCat(where, " has no \"", key, "\""));
      return nullptr;
    }
    return &*it;
  }
  bool Int(const json& obj, const char* key, const std::string& where, int64_t lo, int64_t hi, int64_t* out) {
    const json* f = Field(obj, key, where);
    if (f == nullptr) return false;
    if (!f->is_number_integer()) return Fail(absl::StrCat(where, ".", key, " is not an integer"));
    const int64_t v = f->get<int64_t>();
    if (v < lo || v > hi) return Fail(absl::StrCat(where, ".", key, " is ", v, ", outside [", lo, ", ", hi, "]"));
    *out = v;
    return true;
  }
  template <typename T>
  bool IntAs(const json& obj, const char* key, const std::string& where, int64_t lo, int64_t hi, T* out) {
    int64_t v = 0;
    if (!Int(obj, key, where, lo, hi, &v)) return false;
    *out = static_cast<T>(v);
    return true;
  }
  bool Str(const json& obj, const char* key, const std::string& where, std::string* out) {
    const json* f = Field(obj, key, where);
    if (f == nullptr) return false;
    if (!f->is_string()) return Fail(absl::StrCat(where, ".", key, " is not a string"));
    *out = f->get<std::string>();
    return true;
  }
  bool Num(const json& obj, const char* key, const std::string& where, double* out) {
    const json* f = Field(obj, key, where);
    if (f == nullptr) return false;
    if (!f->is_number()) return Fail(absl::StrCat(where, ".", key, " is not a number"));
    *out = f->get<double>();
    return true;
  }
  bool Bool(const json& obj, const char* key, const std::string& where, bool* out) {
    const json* f = Field(obj, key, where);
    if (f == nullptr) return false;
    if (!f->is_boolean()) return Fail(absl::StrCat(where, ".", key, " is not a boolean"));
    *out = f->get<bool>();
    return true;
  }
  bool Array(const json& obj, const char* key, const std::string& where, const json** out) {
    const json* f = Field(obj, key, where);
    if (f == nullptr) return false;
    if (!f->is_array()) return Fail(absl::StrCat(where, ".", key, " is not an array"));
    *out = f;
    return true;
  }
  bool Dtype(const json& obj, const char* key, const std::string& where, DType* out) {
    std::string s;
    if (!Str(obj, key, where, &s)) return false;
    StatusOr<DType> d = ParseDType(s);
    if (!d.ok()) return Fail(absl::StrCat(where, ".", key, " is \"", s, "\", not a dtype"));
    *out = *d;
    return true;
  }
};

bool ParseRank(const json& jr, const std::string& where, const Meta& m, Parser& p, RankFileMeta& r) {
  const json* sections = nullptr;
  if (!p.Str(jr, "file", where, &r.file) || !p.Int(jr, "bytes", where, kRankHeaderBytes, kMaxElems, &r.bytes) ||
      !p.Array(jr, "sections", where, &sections)) {
    return false;
  }
  if (!SafeFileName(r.file)) {
    return p.Fail(absl::StrCat(where, ".file \"", Printable(r.file), "\" is not a plain file name"));
  }
  int64_t end_of_last = kRankHeaderBytes;
  // A rank's state holds each (unit, stream) once: a Load reads every listed section into the one residual it names,
  // sized from the first, so a second would write past it.
  std::set<std::pair<int, int>> state_seen;
  // The sections, then the rank-state sections after them: in file order, inside the file, checksummed per block.
  auto parse = [&](const json& list, const char* key, bool rank_state, std::vector<Section>& out) {
    for (size_t si = 0; si < list.size(); ++si) {
      const json& js = list[si];
      const std::string sw = absl::StrCat(where, ".", key, "[", si, "]");
      Section s;
      s.rank_state = rank_state;
      const json* crcs = nullptr;
      if (!p.IntAs(js, "unit", sw, 0, static_cast<int64_t>(m.units.size()) - 1, &s.unit)) return false;
      const UnitMeta& u = m.units[s.unit];
      const int64_t streams = rank_state ? kRankStateStreamCount : static_cast<int64_t>(u.streams.size());
      const int64_t limit = rank_state ? kMaxElems : u.numel;
      if (!p.IntAs(js, "stream", sw, 0, streams - 1, &s.stream) || !p.Int(js, "begin", sw, 0, limit, &s.begin) ||
          !p.Int(js, "end", sw, s.begin, limit, &s.end) || !p.Int(js, "offset", sw, end_of_last, r.bytes, &s.offset) ||
          !p.Array(js, "crc32c", sw, &crcs)) {
        return false;
      }
      if (rank_state && !state_seen.insert({s.unit, s.stream}).second) {
        return p.Fail(absl::StrCat(sw, " lists unit ", s.unit, "'s ", kRankStateStreams[s.stream], " a second time"));
      }
      const int64_t bytes = m.SectionBytes(s);
      if (s.offset + bytes > r.bytes) {
        return p.Fail(absl::StrCat(sw, " ends at byte ", s.offset + bytes, ", past the file's ", r.bytes));
      }
      end_of_last = s.offset + bytes;
      const int64_t blocks = (bytes + kBlockBytes - 1) / kBlockBytes;
      if (static_cast<int64_t>(crcs->size()) != blocks) {
        return p.Fail(absl::StrCat(sw, " has ", crcs->size(), " checksums for ", blocks, " blocks"));
      }
      for (const json& c : *crcs) {
        if (!c.is_number_unsigned() || c.get<uint64_t>() > 0xFFFFFFFFull) {
          return p.Fail(absl::StrCat(sw, ".crc32c holds ", c.dump()));
        }
        s.crc.push_back(static_cast<uint32_t>(c.get<uint64_t>()));
      }
      out.push_back(std::move(s));
    }
    return true;
  };
  if (!parse(*sections, "sections", false, r.sections)) return false;
  if (jr.contains("rank_state")) {
    const json* rs = nullptr;
    if (!p.Array(jr, "rank_state", where, &rs)) return false;
    if (!m.qgz && !rs->empty()) {
      return p.Fail(absl::StrCat(where, ".rank_state lists sections, but meta.json has no \"qgz_residuals\""));
    }
    if (!parse(*rs, "rank_state", true, r.rank_state)) return false;
  }
  const json* ts = p.Field(jr, "trainer_state", where);
  if (ts == nullptr) return false;
  if (!ts->is_object()) return p.Fail(absl::StrCat(where, ".trainer_state is not an object"));
  for (auto it = ts->begin(); it != ts->end(); ++it) {
    std::string raw;
    if (!it.value().is_string() || !absl::Base64Unescape(it.value().get<std::string>(), &raw)) {
      return p.Fail(absl::StrCat(where, ".trainer_state.", it.key(), " is not base64"));
    }
    r.trainer_state[it.key()] = std::move(raw);
  }
  return true;
}

bool ParseMeta(const json& j, Parser& p, Meta& m) {
  std::string format;
  if (!p.Str(j, "format", "meta", &format)) return false;
  if (format != "zero-checkpoint") return p.Fail(absl::StrCat("format is \"", format, "\", not \"zero-checkpoint\""));
  int64_t version = 0;
  if (!p.Int(j, "format_version", "meta", 0, 1 << 30, &version)) return false;
  if (version != kFormatVersion) {
    return p.Fail(absl::StrCat("format_version is ", version, "; this build reads version ", kFormatVersion));
  }
  m.format_version = static_cast<int>(version);
  if (!p.Str(j, "tag", "meta", &m.tag) || !p.Str(j, "kind", "meta", &m.kind) ||
      !p.IntAs(j, "world_size", "meta", 1, kMaxWorld, &m.world_size) || !p.IntAs(j, "stage", "meta", 0, 3, &m.stage) ||
      !p.Dtype(j, "compute_dtype", "meta", &m.compute_dtype) || !p.Str(j, "optimizer", "meta", &m.optimizer) ||
      !p.Int(j, "step", "meta", 0, kMaxElems, &m.step) ||
      !p.Int(j, "skipped_steps", "meta", 0, kMaxElems, &m.skipped_steps)) {
    return false;
  }
  // The tools write a copy under DIR/<tag> (reshard) and name it in DIR/latest: a tag that is a path would
  // write outside DIR. Engine::Save accepts only such tags.
  if (!SafeTag(m.tag)) return p.Fail(absl::StrCat("tag \"", Printable(m.tag), "\" is not a plain folder name"));
  const json* names = nullptr;
  if (!p.Array(j, "state_names", "meta", &names)) return false;
  for (const json& n : *names) {
    if (!n.is_string()) return p.Fail("state_names holds a non-string");
    m.state_names.push_back(n.get<std::string>());
  }
  const json* ls = p.Field(j, "loss_scaler", "meta");
  if (ls == nullptr || !p.Num(*ls, "scale", "loss_scaler", &m.loss_scaler.scale) ||
      !p.IntAs(*ls, "hysteresis", "loss_scaler", 0, 1 << 30, &m.loss_scaler.hysteresis) ||
      !p.Int(*ls, "iteration", "loss_scaler", 0, kMaxElems, &m.loss_scaler.iteration) ||
      !p.Int(*ls, "last_overflow_iteration", "loss_scaler", -1, kMaxElems, &m.loss_scaler.last_overflow_iteration)) {
    return false;
  }
  const json* groups = nullptr;
  if (!p.Array(j, "param_groups", "meta", &groups)) return false;
  for (size_t gi = 0; gi < groups->size(); ++gi) {
    const json& jg = (*groups)[gi];
    const std::string where = absl::StrCat("param_groups[", gi, "]");
    GroupMeta g;
    if (!p.Str(jg, "match", where, &g.match) || !p.Num(jg, "lr_scale", where, &g.lr_scale) ||
        !p.Bool(jg, "frozen", where, &g.frozen)) {
      return false;
    }
    for (const char* k : {"weight_decay", "beta1", "beta2", "eps"}) {
      if (jg.contains(k)) {
        double v;
        if (!p.Num(jg, k, where, &v)) return false;
        g.overrides[k] = v;
      }
    }
    m.param_groups.push_back(std::move(g));
  }
  const json* units = nullptr;
  if (!p.Array(j, "units", "meta", &units)) return false;
  for (size_t ui = 0; ui < units->size(); ++ui) {
    const json& ju = (*units)[ui];
    const std::string where = absl::StrCat("units[", ui, "]");
    UnitMeta u;
    if (!p.Str(ju, "name", where, &u.name) || !p.Int(ju, "numel", where, 0, kMaxElems, &u.numel) ||
        !p.Bool(ju, "frozen", where, &u.frozen)) {
      return false;
    }
    if (ju.contains("bare_names") && !p.Bool(ju, "bare_names", where, &u.bare_names)) return false;
    const json* streams = nullptr;
    if (!p.Array(ju, "streams", where, &streams)) return false;
    for (size_t si = 0; si < streams->size(); ++si) {
      StreamMeta s;
      const std::string sw = absl::StrCat(where, ".streams[", si, "]");
      if (!p.Str((*streams)[si], "name", sw, &s.name) || !p.Dtype((*streams)[si], "dtype", sw, &s.dtype)) return false;
      u.streams.push_back(std::move(s));
    }
    const json* params = nullptr;
    if (!p.Array(ju, "params", where, &params)) return false;
    int64_t next = 0;
    for (size_t pi = 0; pi < params->size(); ++pi) {
      const json& jp = (*params)[pi];
      const std::string pw = absl::StrCat(where, ".params[", pi, "]");
      ParamMeta pm;
      const json* shape = nullptr;
      if (!p.Str(jp, "name", pw, &pm.name) || !p.Array(jp, "shape", pw, &shape) ||
          !p.Int(jp, "offset", pw, 0, kMaxElems, &pm.offset) ||
          !p.IntAs(jp, "group", pw, -1, static_cast<int64_t>(m.param_groups.size()) - 1, &pm.group)) {
        return false;
      }
      pm.numel = 1;
      for (const json& d : *shape) {
        if (!d.is_number_integer() || d.get<int64_t>() <= 0 || d.get<int64_t>() > kMaxElems) {
          return p.Fail(absl::StrCat(pw, ".shape holds ", d.dump(), ", not a positive size"));
        }
        pm.shape.push_back(d.get<int64_t>());
        if (pm.numel > kMaxElems / pm.shape.back()) return p.Fail(absl::StrCat(pw, ".shape is too large"));
        pm.numel *= pm.shape.back();
      }
      if (pm.offset != next) {
        return p.Fail(absl::StrCat(pw, ".offset is ", pm.offset, " but the parameters before it end at ", next));
      }
      next += pm.numel;
      u.params.push_back(std::move(pm));
    }
    if (next != u.numel) return p.Fail(absl::StrCat(where, ".numel is ", u.numel, " but its parameters hold ", next));
    m.units.push_back(std::move(u));
  }
  if (j.contains("qgz_residuals")) {
    const json& jq = j["qgz_residuals"];
    QgzStateMeta q;
    const json* rounds = nullptr;
    if (!p.IntAs(jq, "local", "qgz_residuals", 1, m.world_size, &q.local) ||
        !p.IntAs(jq, "bits", "qgz_residuals", 4, 8, &q.bits) ||
        !p.Int(jq, "block", "qgz_residuals", 1, kMaxElems, &q.block) ||
        !p.Dtype(jq, "dtype", "qgz_residuals", &q.dtype) || !p.Array(jq, "rounds", "qgz_residuals", &rounds)) {
      return false;
    }
    if (jq.contains("residuals")) {  // absent in checkpoints from before int8 residuals: the compute dtype's
      std::string kind;
      if (!p.Str(jq, "residuals", "qgz_residuals", &kind)) return false;
      if (kind != "int8" && kind != "compute") {
        return p.Fail(absl::StrCat("qgz_residuals.residuals is \"", kind, "\", not \"compute\" or \"int8\""));
      }
      q.int8 = kind == "int8";
    }
    if (rounds->size() != m.units.size()) {
      return p.Fail(
          absl::StrCat("qgz_residuals.rounds lists ", rounds->size(), " counts for ", m.units.size(), " units"));
    }
    for (const json& c : *rounds) {
      // Bounded as element counts are: the engine adds one per reduction, which must not overflow.
      if (!c.is_number_integer() || c.get<int64_t>() < 0 || c.get<int64_t>() > kMaxElems) {
        return p.Fail(absl::StrCat("qgz_residuals.rounds holds ", c.dump()));
      }
      q.rounds.push_back(c.get<int64_t>());
    }
    m.qgz = std::move(q);
  }
  const json* ranks = nullptr;
  if (!p.Array(j, "ranks", "meta", &ranks)) return false;
  if (static_cast<int64_t>(ranks->size()) != m.world_size) {
    return p.Fail(absl::StrCat("ranks lists ", ranks->size(), " files for world_size ", m.world_size));
  }
  for (size_t ri = 0; ri < ranks->size(); ++ri) {
    RankFileMeta r;
    if (!ParseRank((*ranks)[ri], absl::StrCat("ranks[", ri, "]"), m, p, r)) return false;
    m.ranks.push_back(std::move(r));
  }
  // Every stream of every unit is covered exactly once: the reader then never meets a hole or an overlap.
  std::map<std::pair<int, int>, std::vector<std::pair<int64_t, int64_t>>> cover;
  for (const RankFileMeta& r : m.ranks) {
    for (const Section& s : r.sections) {
      if (s.end > s.begin) cover[{s.unit, s.stream}].push_back({s.begin, s.end});
    }
  }
  for (size_t ui = 0; ui < m.units.size(); ++ui) {
    const UnitMeta& u = m.units[ui];
    for (size_t si = 0; si < u.streams.size(); ++si) {
      auto& v = cover[{static_cast<int>(ui), static_cast<int>(si)}];
      std::sort(v.begin(), v.end());
      int64_t at = 0;
      for (const auto& [b, e] : v) {
        if (b != at) {
          return p.Fail(absl::StrCat("unit ", u.name, " stream ", u.streams[si].name, ": the sections ",
                                     b < at ? "overlap" : "leave a hole", " at element ", std::min(b, at)));
        }
        at = e;
      }
      if (at != u.numel) {
        return p.Fail(absl::StrCat("unit ", u.name, " stream ", u.streams[si].name, ": the sections end at element ",
                                   at, " of ", u.numel));
      }
    }
  }
  return true;
}

// nlohmann::json::parse, refusing nesting deeper than kMaxJsonDepth first (core/internal/json_depth.h): dump()
// and comparisons recurse once per level, and these texts come from files.
json ParseBounded(const std::string& text) {
  if (zero::internal::JsonTooDeepAt(text) != std::string::npos) return json(json::value_t::discarded);
  return json::parse(text, nullptr, /*allow_exceptions=*/false);
}

}  // namespace

bool SafeFileName(const std::string& f) {
  if (f.empty() || f.size() >= 256 || f == "." || f == "..") return false;
  // No control byte (a carriage return or an escape sequence in a name hides or rewrites what a terminal shows).
  for (const char c : f) {
    if (c == '/' || static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return false;
  }
  return true;
}

bool SafeTag(const std::string& tag) { return SafeFileName(tag) && tag != kLatestFile; }

int UnitMeta::Stream(const std::string& n) const {
  for (size_t i = 0; i < streams.size(); ++i) {
    if (streams[i].name == n) return static_cast<int>(i);
  }
  return -1;
}

int64_t Meta::Shard(int unit) const {
  // The engine's rule (shard/internal/layout.h, PaddedNumel): numel rounded up to world × 32, split evenly.
  const int64_t q = int64_t{32} * world_size;
  return (units[unit].numel + q - 1) / q * q / world_size;
}

int64_t Meta::SectionBytes(const Section& s) const {
  const DType dt = s.rank_state ? qgz->dtype : units[s.unit].streams[s.stream].dtype;
  return (s.end - s.begin) * static_cast<int64_t>(DTypeSize(dt));
}

int Meta::Unit(const std::string& n) const {
  for (size_t i = 0; i < units.size(); ++i) {
    if (units[i].name == n) return static_cast<int>(i);
  }
  return -1;
}

std::string MetaToJson(const Meta& meta) {
  json j = MetaJson(meta);
  j["checksum"] = Hex32(Crc32c(0, j.dump().data(), j.dump().size()));
  return j.dump(1) + "\n";
}

StatusOr<Meta> MetaFromJson(const std::string& text, const std::string& what) {
  json j = ParseBounded(text);
  if (j.is_discarded()) {
    return absl::DataLossError(
        absl::StrCat(what, ": not valid JSON (or nested deeper than ", zero::internal::kMaxJsonDepth, " levels)"));
  }
  if (!j.is_object()) return absl::DataLossError(absl::StrCat(what, ": not a JSON object"));
  auto it = j.find("checksum");
  if (it == j.end() || !it->is_string()) return absl::DataLossError(absl::StrCat(what, ": no \"checksum\""));
  const std::string recorded = it->get<std::string>();
  j.erase("checksum");
  const std::string canonical = j.dump();
  const std::string actual = Hex32(Crc32c(0, canonical.data(), canonical.size()));
  if (recorded != actual) {
    return absl::DataLossError(absl::StrCat(what, ": checksum mismatch (recorded ", recorded, ", contents ", actual,
                                            "): the file is damaged"));
  }
  Parser p{what, absl::OkStatus()};
  Meta m;
  if (!ParseMeta(j, p, m)) return p.error;
  return m;
}

std::string RankFileMetaToJson(const RankFileMeta& r) { return RankJson(r).dump(); }

StatusOr<RankFileMeta> RankFileMetaFromJson(const std::string& text, const Meta& meta, int rank) {
  const std::string what = absl::StrCat("rank ", rank, "'s file description");
  json j = ParseBounded(text);
  if (j.is_discarded()) {
    return absl::DataLossError(
        absl::StrCat(what, ": not valid JSON (or nested deeper than ", zero::internal::kMaxJsonDepth, " levels)"));
  }
  Parser p{what, absl::OkStatus()};
  RankFileMeta r;
  if (!ParseRank(j, what, meta, p, r)) return p.error;
  return r;
}

std::string RankFileName(int rank, int world) { return absl::StrFormat("rank-%05d-of-%05d.bin", rank, world); }
std::string DefaultTag(int64_t step) { return absl::StrFormat("step-%08d", step); }

// ---- RankFileWriter ----

void RankFileHeader(int rank, int world, char out[kRankHeaderBytes]) {
  std::memset(out, 0, kRankHeaderBytes);
  std::memcpy(out, kRankMagic, 8);
  const uint32_t fields[3] = {static_cast<uint32_t>(kFormatVersion), static_cast<uint32_t>(rank),
                              static_cast<uint32_t>(world)};
  std::memcpy(out + 8, fields, sizeof(fields));
}

std::vector<uint32_t> SectionCrcs(const void* data, int64_t bytes, void (*between_blocks)()) {
  std::vector<uint32_t> crc;
  const char* p = static_cast<const char*>(data);
  for (int64_t b = 0; b < bytes; b += kBlockBytes) {
    crc.push_back(Crc32c(0, p + b, static_cast<size_t>(std::min(kBlockBytes, bytes - b))));
    if (between_blocks != nullptr) between_blocks();
  }
  return crc;
}

struct RankFileWriter::Impl {
  AtomicFile file;
  RankFileMeta meta;
  Section cur;
  bool open_section = false;
  int64_t block_fill = 0;  // bytes of the current block checksummed so far
  uint32_t block_crc = 0;
};

RankFileWriter::RankFileWriter() : impl_(std::make_unique<Impl>()) {}
RankFileWriter::~RankFileWriter() = default;

Status RankFileWriter::Open(const std::string& path, int rank, int world) {
  ZERO_RETURN_IF_ERROR(impl_->file.Open(path));
  const size_t slash = path.find_last_of('/');
  impl_->meta.file = slash == std::string::npos ? path : path.substr(slash + 1);
  char header[kRankHeaderBytes];
  RankFileHeader(rank, world, header);
  return impl_->file.Write(header, sizeof(header));
}

Status RankFileWriter::BeginSection(int unit, int stream, int64_t begin, int64_t end, DType) {
  Impl& m = *impl_;
  m.cur = Section{unit, stream, begin, end, m.file.written(), {}};
  m.open_section = true;
  m.block_fill = 0;
  m.block_crc = 0;
  return absl::OkStatus();
}

Status RankFileWriter::BeginRankStateSection(int unit, int stream, int64_t elems) {
  ZERO_RETURN_IF_ERROR(BeginSection(unit, stream, 0, elems, DType::kF32));
  impl_->cur.rank_state = true;
  return absl::OkStatus();
}

Status RankFileWriter::Append(const void* data, size_t bytes) {
  Impl& m = *impl_;
  const char* p = static_cast<const char*>(data);
  size_t left = bytes;
  while (left > 0) {
    const size_t take = std::min<size_t>(left, static_cast<size_t>(kBlockBytes - m.block_fill));
    m.block_crc = Crc32c(m.block_crc, p, take);
    m.block_fill += static_cast<int64_t>(take);
    if (m.block_fill == kBlockBytes) {
      m.cur.crc.push_back(m.block_crc);
      m.block_fill = 0;
      m.block_crc = 0;
    }
    p += take;
    left -= take;
  }
  return m.file.Write(data, bytes);
}

Status RankFileWriter::EndSection() {
  Impl& m = *impl_;
  if (m.block_fill > 0) m.cur.crc.push_back(m.block_crc);
  (m.cur.rank_state ? m.meta.rank_state : m.meta.sections).push_back(std::move(m.cur));
  m.open_section = false;
  return absl::OkStatus();
}

StatusOr<RankFileMeta> RankFileWriter::Commit() {
  impl_->meta.bytes = impl_->file.written();
  ZERO_RETURN_IF_ERROR(impl_->file.Commit());
  return std::move(impl_->meta);
}

// ---- CheckpointReader ----

CheckpointReader::~CheckpointReader() {
  for (int fd : fds_) {
    if (fd >= 0) ::close(fd);
  }
}

StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(const std::string& dir, const std::string& tag) {
  std::string t = tag;
  if (t.empty()) {
    ZERO_ASSIGN_OR_RETURN(t, ResumeCheckpointTag(dir));
  } else if (!SafeTag(t)) {
    return absl::InvalidArgumentError(absl::StrCat("tag \"", Printable(t), "\" is not a plain folder name"));
  }
  auto r = std::unique_ptr<CheckpointReader>(new CheckpointReader());
  r->folder_ = absl::StrCat(dir, "/", t);
  const std::string meta_path = absl::StrCat(r->folder_, "/", kMetaFile);
  if (!Exists(meta_path)) {
    if (Exists(r->folder_)) {
      return absl::DataLossError(absl::StrCat("checkpoint ", Printable(r->folder_), " is incomplete: it has no ",
                                              kMetaFile, " (the save did not finish)"));
    }
    return absl::NotFoundError(absl::StrCat("no checkpoint ", Printable(r->folder_)));
  }
  ZERO_ASSIGN_OR_RETURN(std::string text, ReadFile(meta_path));
  ZERO_ASSIGN_OR_RETURN(r->meta_, MetaFromJson(text, meta_path));
  r->fds_.assign(r->meta_.ranks.size(), -1);
  for (size_t ri = 0; ri < r->meta_.ranks.size(); ++ri) {
    const auto& secs = r->meta_.ranks[ri].sections;
    for (size_t si = 0; si < secs.size(); ++si) {
      r->index_[{secs[si].unit, secs[si].stream}].push_back({static_cast<int>(ri), static_cast<int>(si)});
    }
  }
  for (auto& [key, v] : r->index_) {
    std::sort(v.begin(), v.end(), [&](const auto& a, const auto& b) {
      return r->meta_.ranks[a.first].sections[a.second].begin < r->meta_.ranks[b.first].sections[b.second].begin;
    });
  }
  return r;
}

std::string CheckpointReader::SectionName(int rank, const Section& s) const {
  const UnitMeta& u = meta_.units[s.unit];
  return absl::StrCat(folder_, "/", meta_.ranks[rank].file, " (unit ", u.name, ", ",
                      s.rank_state ? kRankStateStreams[s.stream] : u.streams[s.stream].name.c_str(), ", elements ",
                      s.begin, "-", s.end, ")");
}

Status CheckpointReader::OpenRank(int rank) {
  if (fds_[rank] >= 0) return absl::OkStatus();
  const RankFileMeta& rf = meta_.ranks[rank];
  const std::string path = absl::StrCat(folder_, "/", rf.file);
  StatusOr<int> opened = OpenRegular(path);
  if (!opened.ok()) {
    if (!absl::IsNotFound(opened.status())) return opened.status();
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", Printable(folder_), " is incomplete: rank file ", Printable(path), " is missing"));
  }
  const int fd = *opened;
  // Kept only once its size and header check out: a file that failed them fails every later read too (fuzz/
  // found a second VerifyAll passing once the first had failed on the header).
  struct Closer {
    int fd;
    ~Closer() {
      if (fd >= 0) ::close(fd);
    }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) return absl::InternalError(absl::StrCat("cannot stat ", Printable(path)));
  const auto size = static_cast<int64_t>(st.st_size);
  if (size != rf.bytes) {
    return absl::DataLossError(absl::StrCat(path, " is ", size, " bytes but ", kMetaFile, " records ", rf.bytes,
                                            size < rf.bytes ? " (truncated)" : ""));
  }
  char header[kRankHeaderBytes];
  ZERO_RETURN_IF_ERROR(ReadAt(fd, path, 0, header, sizeof(header)));
  uint32_t fields[3];
  std::memcpy(fields, header + 8, sizeof(fields));
  bool reserved_zero = true;  // bytes 20-63 are reserved, written as zeros: anything else is damage
  for (int64_t i = 20; i < kRankHeaderBytes; ++i) reserved_zero = reserved_zero && header[i] == 0;
  if (!reserved_zero || std::memcmp(header, kRankMagic, 8) != 0 || fields[0] != static_cast<uint32_t>(kFormatVersion) ||
      fields[1] != static_cast<uint32_t>(rank) || fields[2] != static_cast<uint32_t>(meta_.world_size)) {
    return absl::DataLossError(absl::StrCat(path, ": the header is not that of rank ", rank, " of ", meta_.world_size,
                                            " in format version ", kFormatVersion));
  }
  if (io_ != nullptr) {
    files_.resize(fds_.size());
    ZERO_ASSIGN_OR_RETURN(files_[rank], io::IoFile::Open(path, io::IoFile::Mode::kRead));
  }
  fds_[rank] = fd;
  closer.fd = -1;
  return absl::OkStatus();
}

Status CheckpointReader::ReadBytes(int rank, const std::string& where, int64_t offset, void* dst, size_t n) {
  if (io_ != nullptr && rank < static_cast<int>(files_.size()) && files_[rank].is_open()) {
    return io_->Read(files_[rank], offset, dst, static_cast<int64_t>(n));
  }
  return ReadAt(fds_[rank], where, offset, dst, n);
}

Status CheckpointReader::ReadBlock(int rank, const Section& s, int64_t block, const std::string& where) {
  if (cache_rank_ == rank && cache_section_ == &s && cache_block_ == block) return absl::OkStatus();
  ZERO_RETURN_IF_ERROR(OpenRank(rank));
  const int64_t bytes = meta_.SectionBytes(s);
  const int64_t b0 = block * kBlockBytes, n = std::min(kBlockBytes, bytes - b0);
  cache_rank_ = -1;
  cache_.resize(static_cast<size_t>(n));
  ZERO_RETURN_IF_ERROR(ReadBytes(rank, where, s.offset + b0, cache_.data(), cache_.size()));
  const uint32_t crc = Crc32c(0, cache_.data(), cache_.size());
  if (crc != s.crc[block]) {
    return absl::DataLossError(absl::StrCat(where, ": checksum mismatch in block ", block, " (bytes ", s.offset + b0,
                                            "-", s.offset + b0 + n, "): the file is damaged"));
  }
  cache_rank_ = rank;
  cache_section_ = &s;
  cache_block_ = block;
  return absl::OkStatus();
}

Status CheckpointReader::Read(int unit, int stream, int64_t begin, int64_t end, DType dtype, void* dst) {
  auto it = index_.find({unit, stream});
  const size_t des = DTypeSize(dtype);
  char* out = static_cast<char*>(dst);
  if (begin >= end) return absl::OkStatus();
  if (it == index_.end()) return absl::InternalError("CheckpointReader::Read: no such stream");
  for (const auto& [rank, si] : it->second) {
    const Section& s = meta_.ranks[rank].sections[si];
    const int64_t lo = std::max(begin, s.begin), hi = std::min(end, s.end);
    if (lo >= hi) continue;
    const DType sdt = meta_.units[unit].streams[stream].dtype;
    const int64_t es = static_cast<int64_t>(DTypeSize(sdt));
    const std::string where = SectionName(rank, s);
    int64_t x = lo;
    while (x < hi) {
      const int64_t byte = (x - s.begin) * es, block = byte / kBlockBytes;
      const int64_t block_elems = kBlockBytes / es, block_end = s.begin + (block + 1) * block_elems;
      const int64_t section_bytes = (s.end - s.begin) * es;
      if (sdt == dtype && byte % kBlockBytes == 0 && (std::min(hi, block_end) == block_end || hi == s.end) &&
          !(cache_rank_ == rank && cache_section_ == &s && cache_block_ == block)) {
        // A whole block wanted as stored: read it straight into dst and check it there (no copy).
        ZERO_RETURN_IF_ERROR(OpenRank(rank));
        const int64_t n = std::min(kBlockBytes, section_bytes - byte);
        char* to = out + (x - begin) * des;
        ZERO_RETURN_IF_ERROR(ReadBytes(rank, where, s.offset + byte, to, static_cast<size_t>(n)));
        if (Crc32c(0, to, static_cast<size_t>(n)) != s.crc[block]) {
          return absl::DataLossError(absl::StrCat(where, ": checksum mismatch in block ", block, " (bytes ",
                                                  s.offset + byte, "-", s.offset + byte + n, "): the file is damaged"));
        }
        x += n / es;
        continue;
      }
      ZERO_RETURN_IF_ERROR(ReadBlock(rank, s, block, where));
      const int64_t block_end_elem = s.begin + (block + 1) * kBlockBytes / es;
      const int64_t n = std::min(hi, block_end_elem) - x;
      ConvertBuffer(cache_.data() + (byte - block * kBlockBytes), sdt, out + (x - begin) * des, dtype,
                    static_cast<size_t>(n));
      x += n;
    }
  }
  return absl::OkStatus();
}

Status CheckpointReader::VerifyAll() {
  for (size_t r = 0; r < meta_.ranks.size(); ++r) {
    ZERO_RETURN_IF_ERROR(OpenRank(static_cast<int>(r)));
    for (const auto* list : {&meta_.ranks[r].sections, &meta_.ranks[r].rank_state}) {
      for (const Section& s : *list) {
        for (size_t b = 0; b < s.crc.size(); ++b) {
          ZERO_RETURN_IF_ERROR(ReadBlock(static_cast<int>(r), s, static_cast<int64_t>(b), SectionName(r, s)));
        }
      }
    }
  }
  return absl::OkStatus();
}

Status CheckpointReader::ReadRankState(int rank, const Section& s, void* dst) {
  const std::string where = SectionName(rank, s);
  const int64_t bytes = meta_.SectionBytes(s);
  char* out = static_cast<char*>(dst);
  for (int64_t block = 0; block * kBlockBytes < bytes; ++block) {
    ZERO_RETURN_IF_ERROR(ReadBlock(rank, s, block, where));
    std::memcpy(out + block * kBlockBytes, cache_.data(), cache_.size());
  }
  return absl::OkStatus();
}

Status CommitCheckpoint(const std::string& dir, const Meta& meta) {
  // Every rank file is committed by now, so a `*.tmp.*` file here, or a rank file meta.json will not list (of
  // another world size), is what an earlier attempt at this tag left when it was killed: removed, so that the
  // folder holds exactly what its meta.json lists (a stray file outlived the next successful save before).
  const std::string folder = absl::StrCat(dir, "/", meta.tag);
  if (DIR* d = ::opendir(folder.c_str())) {
    std::vector<std::string> stray;
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n.find(".tmp.") == std::string::npos && n.rfind("rank-", 0) != 0) continue;
      bool listed = false;
      for (const RankFileMeta& r : meta.ranks) listed = listed || r.file == n;
      if (!listed) stray.push_back(n);
    }
    ::closedir(d);
    for (const std::string& n : stray) ::unlink(absl::StrCat(folder, "/", n).c_str());
  }
  ZERO_RETURN_IF_ERROR(WriteFileAtomic(absl::StrCat(folder, "/", kMetaFile), MetaToJson(meta)));
  return WriteFileAtomic(absl::StrCat(dir, "/", kLatestFile), meta.tag + "\n");
}

}  // namespace zero::ckpt

namespace zero {

StatusOr<std::string> LatestCheckpointTag(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", ckpt::kLatestFile);
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0 && errno == ENOENT) {
    return absl::NotFoundError(
        absl::StrCat("no checkpoint in ", ckpt::Printable(dir), " (no ", ckpt::Printable(path), ")"));
  }
  // A tag is under 256 bytes: more is not a `latest` this library wrote, and is not read whole.
  ZERO_ASSIGN_OR_RETURN(std::string t, ckpt::ReadFile(path, 4096));
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  if (!ckpt::SafeTag(t)) {
    return absl::DataLossError(absl::StrCat(ckpt::Printable(path), " holds \"", ckpt::Printable(t),
                                            "\", which does not name a checkpoint folder"));
  }
  return t;
}

StatusOr<std::string> NewestCompleteCheckpoint(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return absl::NotFoundError(absl::StrCat("no checkpoint in ", ckpt::Printable(dir)));
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) names.push_back(e->d_name);
  ::closedir(d);
  std::string best;
  int64_t best_step = -1;
  for (const std::string& n : names) {
    if (!ckpt::SafeTag(n) || n.find(".tmp.") != std::string::npos) continue;
    const std::string meta_path = absl::StrCat(dir, "/", n, "/", ckpt::kMetaFile);
    if (!ckpt::Exists(meta_path)) continue;
    StatusOr<std::string> text = ckpt::ReadFile(meta_path);
    if (!text.ok()) continue;
    StatusOr<ckpt::Meta> m = ckpt::MetaFromJson(*text, meta_path);
    if (!m.ok() || m->tag != n) continue;
    if (m->step > best_step || (m->step == best_step && n > best)) {
      best = n;
      best_step = m->step;
    }
  }
  if (best.empty()) return absl::NotFoundError(absl::StrCat("no complete checkpoint in ", ckpt::Printable(dir)));
  return best;
}

StatusOr<std::string> ResumeCheckpointTag(const std::string& dir) {
  StatusOr<std::string> latest = LatestCheckpointTag(dir);
  if (latest.ok()) return latest;
  StatusOr<std::string> newest = NewestCompleteCheckpoint(dir);
  if (!newest.ok()) {
    // Nothing complete: "no checkpoint yet" where `latest` is simply absent; its own error where it is there but
    // unusable (a FIFO, a loop, damage), which a run must not read as an empty folder.
    return latest.status();
  }
  const std::string d = ckpt::Printable(dir);
  return absl::FailedPreconditionError(
      absl::StrCat(absl::IsNotFound(latest.status()) ? absl::StrCat(d, "/", ckpt::kLatestFile, " is missing")
                                                     : std::string(latest.status().message()),
                   ", but ", d, " holds complete checkpoints, the newest ", d, "/", *newest,
                   ": starting over beside them would be wrong. To resume from it, check it (zero-ckpt verify ", d,
                   " --tag ", *newest, ") and make it the latest (rm -f ", d, "/", ckpt::kLatestFile, "; echo ",
                   *newest, " > ", d, "/", ckpt::kLatestFile, "), or load it by its tag (LoadOptions::tag)"));
}

}  // namespace zero
