// elastic/replica_groups.cc — live recovery across replica groups (zero/elastic.h): the decisions in the store,
// and the engine regrouped under each.
//
// The store holds, under "zero-live.":
//   epoch.<e>          the decision of epoch e (JSON, write-once), published.<e> its counter (1 once written)
//   claim.<e>          a counter: the rank whose Add returns 1 decides epoch e
//   joins, join.<k>    the count of groups announced ready to join, and the k-th ("<group> <incarnation>")
//   alive.<e>.<g>      after a failure: group g's applied steps + 1, said by its first rank for epoch e
//   lost.<g>.<i>       incarnation i of group g failed on its own (its rank's communicator broke, or zero-run saw
//                      one of its ranks exit)
//   done               the job finished (Leave): a group still waiting to join stops waiting
// Counters are read without blocking (Add of 0), so a rank looks at the store once per step at most.
#include "zero/elastic.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "comm/internal/env.h"
#include "nlohmann/json.hpp"
#include "shard/internal/engine_impl.h"
#include "shard/internal/step.h"
#include "zero/logging.h"

namespace zero {
namespace {

std::string Key(const std::string& what) { return absl::StrCat("zero-live.", what); }
std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string Text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }
void Pause() { std::this_thread::sleep_for(std::chrono::milliseconds(20)); }

std::string Encode(const Membership& m) {
  nlohmann::json j = {{"epoch", m.epoch},
                      {"groups", m.groups},
                      {"incarnations", m.incarnations},
                      {"step", m.step},
                      {"after_failure", m.after_failure},
                      {"copy", m.copy},
                      {"source", m.source},
                      {"joins_covered", m.joins_covered},
                      {"why", m.why}};
  return j.dump();
}

StatusOr<Membership> Decode(const std::string& text, int64_t e) {
  Membership m;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    j.at("epoch").get_to(m.epoch);
    j.at("groups").get_to(m.groups);
    j.at("incarnations").get_to(m.incarnations);
    j.at("step").get_to(m.step);
    j.at("after_failure").get_to(m.after_failure);
    j.at("copy").get_to(m.copy);
    j.at("source").get_to(m.source);
    j.at("joins_covered").get_to(m.joins_covered);
    j.at("why").get_to(m.why);
  } catch (const std::exception& ex) {
    return absl::DataLossError(absl::StrCat("live recovery: the store's epoch ", e, " is not a decision: ", ex.what()));
  }
  if (m.epoch != e || m.groups.size() != m.incarnations.size() || m.groups.empty()) {
    return absl::DataLossError(absl::StrCat("live recovery: the store's epoch ", e, " is malformed: ", text));
  }
  return m;
}

std::string GroupList(const std::vector<int>& groups) { return absl::StrCat("{", absl::StrJoin(groups, ", "), "}"); }

}  // namespace

ReplicaGroups::ReplicaGroups(LiveOptions options) : opt_(std::move(options)) {
  group_ = opt_.rank / opt_.group_size;
  shard_rank_ = opt_.rank % opt_.group_size;
}
ReplicaGroups::~ReplicaGroups() = default;

StatusOr<std::unique_ptr<ReplicaGroups>> ReplicaGroups::Create(LiveOptions options) {
  if (options.store == nullptr) return absl::InvalidArgumentError("ReplicaGroups::Create: LiveOptions::store is null");
  const int G = options.group_size, N = options.world_size;
  if (G < 1 || N < G || N % G != 0 || options.rank < 0 || options.rank >= N) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ReplicaGroups::Create: rank ", options.rank, " of world size ", N, " in groups of ", G,
        " (zero_optimization.mics_shard_size): the world size must be a positive multiple of the group size"));
  }
  if (options.incarnation < 0) return absl::InvalidArgumentError("ReplicaGroups::Create: negative incarnation");
  std::unique_ptr<ReplicaGroups> g(new ReplicaGroups(std::move(options)));
  CommOptions o = g->opt_.comm;
  o.prefix = Key(absl::StrCat("group.", g->group_, ".", g->opt_.incarnation));
  ZERO_ASSIGN_OR_RETURN(g->group_comm_, Communicator::CreateGloo(g->opt_.store, g->shard_rank_, G, o));
  return g;
}

StatusOr<std::unique_ptr<ReplicaGroups>> ReplicaGroups::FromEnv(const Config& config) {
  const internal::EnvLookup env = internal::ProcessEnv();
  ZERO_ASSIGN_OR_RETURN(internal::LaunchEnv launch, internal::ReadLaunchEnv(env));
  if (launch.source == "default") {  // ReadLaunchEnv's "no launcher found"
    return absl::InvalidArgumentError(
        "ReplicaGroups::FromEnv: no launcher variables (RANK and WORLD_SIZE); run under zero-run --live-groups G");
  }
  if (launch.store_dir.empty()) {
    return absl::FailedPreconditionError(
        "ReplicaGroups::FromEnv: live recovery keeps its decisions in a store that outlives every rank: set "
        "ZERO_STORE_DIR to a folder every rank shares (zero-run sets it); a TCP store (MASTER_ADDR) is served by "
        "rank 0 and would die with it");
  }
  LiveOptions o;
  o.store = Store::File(launch.store_dir);
  o.rank = launch.rank;
  o.world_size = launch.world_size;
  o.group_size = static_cast<int>(config.zero.mics_shard_size);
  if (o.group_size <= 0 || o.group_size >= o.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ReplicaGroups::FromEnv: zero_optimization.mics_shard_size is ", config.zero.mics_shard_size,
        "; live recovery needs replica groups: a group size in [1, ", o.world_size, ") dividing the world size"));
  }
  for (const char* name : {"ZERO_GROUP_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"}) {
    if (auto v = env(name)) {
      if (!absl::SimpleAtoi(*v, &o.incarnation) || o.incarnation < 0) {
        return absl::InvalidArgumentError(absl::StrCat(name, "=", *v, " is not a count"));
      }
      break;
    }
  }
  o.comm.timeout = absl::Seconds(config.comm_timeout_s);
  ZERO_ASSIGN_OR_RETURN(o.comm, internal::ApplyCommEnvOverrides(o.comm, env));
  ZERO_RETURN_IF_ERROR(internal::CheckCommTimeout(o.comm.timeout));
  if (o.comm.job_id.empty()) o.comm.job_id = internal::JobIdFromEnv(env);
  if (internal::IsLoopbackHost(launch.master_addr)) o.comm.hostname = "127.0.0.1";
  return Create(std::move(o));
}

int ReplicaGroups::world_rank() const { return world_comm_ ? world_comm_->rank() : -1; }
int ReplicaGroups::world_size() const { return world_comm_ ? world_comm_->world_size() : 0; }

absl::Duration ReplicaGroups::DecideTimeout() const {
  return opt_.decide_timeout > absl::ZeroDuration() ? opt_.decide_timeout : 2 * opt_.comm.timeout;
}

Status ReplicaGroups::Publish(const Membership& m) {
  ZERO_RETURN_IF_ERROR(opt_.store->Set(Key(absl::StrCat("epoch.", m.epoch)), Bytes(Encode(m))));
  decisions_[m.epoch] = m;
  return opt_.store->Add(Key(absl::StrCat("published.", m.epoch)), 1).status();
}

StatusOr<Membership> ReplicaGroups::WaitForEpoch(int64_t e, absl::Time deadline) {
  const absl::Duration left = std::max(deadline - absl::Now(), absl::Milliseconds(1));
  ZERO_ASSIGN_OR_RETURN(std::vector<uint8_t> text, opt_.store->Get(Key(absl::StrCat("epoch.", e)), left));
  ZERO_ASSIGN_OR_RETURN(Membership m, Decode(Text(text), e));
  decisions_[e] = m;
  return m;
}

Status ReplicaGroups::LearnDecisionsBefore(int64_t e) {
  for (int64_t k = 1; k < e; ++k) {
    // Published before `e` was decided: already in the store, the wait is only the file system's.
    if (!decisions_.contains(k)) ZERO_RETURN_IF_ERROR(WaitForEpoch(k, absl::Now() + opt_.comm.timeout).status());
  }
  return absl::OkStatus();
}

int64_t ReplicaGroups::SamplesBefore(int64_t step, int64_t samples_per_rank) const {
  // (first step, ranks) from each decision in epoch order; a decision for step s ends every span that a decision
  // before it opened at s or later.
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const auto& [e, m] : decisions_) {
    while (!spans.empty() && spans.back().first >= m.step) spans.pop_back();
    spans.emplace_back(m.step, static_cast<int64_t>(m.groups.size()) * opt_.group_size);
  }
  if (spans.empty()) return 0;
  int64_t samples = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    const int64_t from = i == 0 ? 0 : spans[i].first;
    const int64_t to = std::min(step, i + 1 < spans.size() ? spans[i + 1].first : step);
    if (to > from) samples += (to - from) * spans[i].second * samples_per_rank;
  }
  return samples;
}

StatusOr<std::vector<std::pair<int, int>>> ReplicaGroups::Joiners(int64_t covered, int64_t upto) {
  std::vector<std::pair<int, int>> out;
  for (int64_t k = covered + 1; k <= upto; ++k) {
    ZERO_ASSIGN_OR_RETURN(std::vector<uint8_t> v, opt_.store->Get(Key(absl::StrCat("join.", k)), opt_.comm.timeout));
    std::vector<std::string> parts = absl::StrSplit(Text(v), ' ');
    int g = -1, inc = -1;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &g) || !absl::SimpleAtoi(parts[1], &inc)) {
      return absl::DataLossError(absl::StrCat("live recovery: join announcement ", k, " is malformed"));
    }
    // A group announced twice (restarted before it was admitted) joins as its latest incarnation.
    auto it = std::find_if(out.begin(), out.end(), [g](const auto& p) { return p.first == g; });
    if (it != out.end()) {
      it->second = std::max(it->second, inc);
    } else {
      out.emplace_back(g, inc);
    }
  }
  return out;
}

Status ReplicaGroups::Apply(Engine& engine, const Membership& m) {
  ZERO_RETURN_IF_ERROR(LearnDecisionsBefore(m.epoch));
  decisions_[m.epoch] = m;
  const auto at = std::find(m.groups.begin(), m.groups.end(), group_);
  const int index = static_cast<int>(at - m.groups.begin());
  const int G = opt_.group_size, W = static_cast<int>(m.groups.size()) * G;
  const auto t0 = absl::Now();
  CommOptions o = opt_.comm;
  o.prefix = Key(absl::StrCat("epoch.", m.epoch, ".comm"));
  o.timeout = opt_.replica_timeout > absl::ZeroDuration() ? opt_.replica_timeout : opt_.comm.timeout / 3;
  ZERO_ASSIGN_OR_RETURN(std::shared_ptr<Communicator> world,
                        Communicator::CreateGloo(opt_.store, index * G + shard_rank_, W, o));
  ZERO_RETURN_IF_ERROR(engine.impl_->Regroup(world));
  if (m.copy && m.groups.size() > 1) {
    const int root = static_cast<int>(std::find(m.groups.begin(), m.groups.end(), m.source) - m.groups.begin());
    ZERO_RETURN_IF_ERROR(engine.impl_->BroadcastState(root));
  }
  world_comm_ = std::move(world);
  epoch_ = m;
  joins_covered_ = m.joins_covered;
  history_.push_back(m);
  if (shard_rank_ == 0) {
    ZERO_LOG(INFO) << "live recovery: epoch " << m.epoch << ": " << m.why << "; group " << group_ << " regrouped in "
                   << absl::FormatDuration(absl::Now() - t0) << " at step " << engine.steps();
  }
  return absl::OkStatus();
}

Status ReplicaGroups::Join(Engine& engine) {
  if (epoch_.epoch != 0) return absl::FailedPreconditionError("ReplicaGroups::Join: already joined");
  if (engine.world_size() != opt_.group_size) {
    return absl::InvalidArgumentError(absl::StrCat("ReplicaGroups::Join: the engine runs over ", engine.world_size(),
                                                   " ranks; create it over group_comm() (", opt_.group_size, ")"));
  }
  if (engine.on_device()) {
    return absl::UnimplementedError(
        "ReplicaGroups::Join: live recovery runs on the host (Gloo) engine; the CUDA engine's state copy is not "
        "built");
  }
  engine.impl_->ctx.live_recovery = true;
  Store& store = *opt_.store;
  const int groups = opt_.world_size / opt_.group_size;
  if (shard_rank_ == 0) {
    ZERO_ASSIGN_OR_RETURN(const int64_t k, store.Add(Key("joins"), 1));
    ZERO_RETURN_IF_ERROR(store.Set(Key(absl::StrCat("join.", k)), Bytes(absl::StrCat(group_, " ", opt_.incarnation))));
  }
  const absl::Time deadline = absl::Now() + opt_.join_timeout;
  int64_t e = 1;
  while (absl::Now() < deadline) {
    ZERO_ASSIGN_OR_RETURN(const int64_t done, store.Add(Key("done"), 0));
    if (done > 0) {
      return absl::CancelledError(absl::StrCat("ReplicaGroups::Join: the job finished before group ", group_,
                                               " (incarnation ", opt_.incarnation, ") was admitted"));
    }
    ZERO_ASSIGN_OR_RETURN(const int64_t published, store.Add(Key(absl::StrCat("published.", e)), 0));
    if (published == 0) {
      // Nothing decided at e. At e = 1 the job has not formed: a first rank of some group forms it once every
      // group has said it is ready.
      if (e == 1 && shard_rank_ == 0) {
        ZERO_ASSIGN_OR_RETURN(const int64_t joined, store.Add(Key("joins"), 0));
        if (joined >= groups) {
          ZERO_ASSIGN_OR_RETURN(const int64_t claim, store.Add(Key("claim.1"), 1));
          if (claim == 1) {
            ZERO_ASSIGN_OR_RETURN(auto joiners, Joiners(0, joined));
            std::sort(joiners.begin(), joiners.end());
            Membership m;
            m.epoch = 1;
            for (const auto& [g, inc] : joiners) {
              m.groups.push_back(g);
              m.incarnations.push_back(inc);
            }
            m.step = engine.steps();
            m.copy = true;  // every group starts from the lowest group's values, bit for bit
            m.source = m.groups.front();
            m.joins_covered = joined;
            m.why = absl::StrCat("groups ", GroupList(m.groups), " form the job; state from group ", m.source);
            ZERO_RETURN_IF_ERROR(Publish(m));
          }
        }
      }
      Pause();
      continue;
    }
    ZERO_ASSIGN_OR_RETURN(Membership m, WaitForEpoch(e, deadline));
    bool named = false;
    for (size_t i = 0; i < m.groups.size(); ++i) {
      named = named || (m.groups[i] == group_ && m.incarnations[i] == opt_.incarnation);
    }
    if (named) {
      const Status s = Apply(engine, m);
      if (s.ok()) return s;
      // A decision that another one overtook (a failure while this group was being admitted): wait for the
      // admission after it.
      ZERO_ASSIGN_OR_RETURN(const int64_t next, store.Add(Key(absl::StrCat("published.", e + 1)), 0));
      if (next == 0) return s;
      ZERO_LOG(WARNING) << "live recovery: group " << group_ << " could not join epoch " << e << " (" << s.message()
                        << "); a later decision exists, waiting for the next admission";
    }
    ++e;
  }
  return absl::DeadlineExceededError(absl::StrCat("ReplicaGroups::Join: group ", group_, " (incarnation ",
                                                  opt_.incarnation, ") was not admitted within ",
                                                  absl::FormatDuration(opt_.join_timeout)));
}

Status ReplicaGroups::AtStepBoundary(Engine& engine) {
  if (epoch_.epoch == 0) return absl::FailedPreconditionError("ReplicaGroups::AtStepBoundary: call Join first");
  Store& store = *opt_.store;
  const int64_t step = engine.steps(), next = epoch_.epoch + 1;
  const std::string published_key = Key(absl::StrCat("published.", next));
  ZERO_ASSIGN_OR_RETURN(int64_t published, store.Add(published_key, 0));
  if (published == 0 && world_rank() == 0) {
    // The first rank of the lowest group admits the groups that announced themselves, from the next step: no
    // rank of the groups present can finish this step before this rank has begun it, so every one of them
    // sees the decision at the next step's boundary at the latest.
    ZERO_ASSIGN_OR_RETURN(const int64_t joined, store.Add(Key("joins"), 0));
    if (joined > joins_covered_) {
      ZERO_ASSIGN_OR_RETURN(const int64_t claim, store.Add(Key(absl::StrCat("claim.", next)), 1));
      if (claim == 1) {
        ZERO_ASSIGN_OR_RETURN(auto joiners, Joiners(joins_covered_, joined));
        Membership m;
        m.epoch = next;
        std::vector<std::pair<int, int>> all;
        for (size_t i = 0; i < epoch_.groups.size(); ++i) all.emplace_back(epoch_.groups[i], epoch_.incarnations[i]);
        std::vector<int> came;
        for (const auto& [g, inc] : joiners) {
          auto it = std::find_if(all.begin(), all.end(), [g = g](const auto& p) { return p.first == g; });
          if (it != all.end() && it->second >= inc) continue;  // announced before, admitted since
          if (it != all.end()) {
            it->second = inc;
          } else {
            all.emplace_back(g, inc);
          }
          came.push_back(g);
        }
        std::sort(all.begin(), all.end());
        for (const auto& [g, inc] : all) {
          m.groups.push_back(g);
          m.incarnations.push_back(inc);
        }
        m.step = step + 1;
        m.copy = !came.empty();
        m.source = group_;
        m.joins_covered = joined;
        m.why = came.empty() ? absl::StrCat("no group to admit; groups ", GroupList(m.groups), " go on")
                             : absl::StrCat("group(s) ", GroupList(came), " rejoin: groups ", GroupList(m.groups),
                                            " from step ", m.step, ", state from group ", group_);
        ZERO_RETURN_IF_ERROR(Publish(m));
        published = 1;
      }
    }
  }
  if (published == 0) return absl::OkStatus();
  ZERO_ASSIGN_OR_RETURN(Membership m, WaitForEpoch(next, absl::Now() + opt_.comm.timeout));
  if (m.after_failure || m.step > step) return absl::OkStatus();  // Recover's, or from the next boundary on
  return Apply(engine, m);
}

Status ReplicaGroups::Leave() {
  if (world_rank() != 0) return absl::OkStatus();
  return opt_.store->Add(Key("done"), 1).status();
}

Status ReplicaGroups::DecideAfterFailure(int64_t e) {
  Store& store = *opt_.store;
  const absl::Time deadline = absl::Now() + DecideTimeout();
  const size_t n = epoch_.groups.size();
  std::vector<int64_t> alive(n, 0);
  std::vector<bool> lost(n, false);
  while (true) {
    bool all_known = true;
    for (size_t i = 0; i < n; ++i) {
      const int g = epoch_.groups[i];
      ZERO_ASSIGN_OR_RETURN(alive[i], store.Add(Key(absl::StrCat("alive.", e, ".", g)), 0));
      ZERO_ASSIGN_OR_RETURN(const int64_t l, store.Add(Key(absl::StrCat("lost.", g, ".", epoch_.incarnations[i])), 0));
      lost[i] = l > 0;
      all_known = all_known && (alive[i] > 0 || lost[i]);
    }
    if (all_known || absl::Now() >= deadline) break;
    Pause();
  }
  Membership m;
  m.epoch = e;
  m.after_failure = true;
  m.joins_covered = epoch_.joins_covered;
  std::vector<std::string> left;
  int64_t furthest = -1, behind = 0;
  for (size_t i = 0; i < n; ++i) {
    const int g = epoch_.groups[i];
    if (alive[i] > 0 && !lost[i]) {
      m.groups.push_back(g);
      m.incarnations.push_back(epoch_.incarnations[i]);
      if (alive[i] - 1 > furthest) {
        furthest = alive[i] - 1;
        m.source = g;
      }
    } else {
      left.push_back(
          absl::StrCat(g, lost[i] ? " (a rank's communicator failed)"
                                  : absl::StrCat(" (no answer within ", absl::FormatDuration(DecideTimeout()), ")")));
    }
  }
  for (size_t i = 0; i < n; ++i) behind += (alive[i] > 0 && !lost[i] && alive[i] - 1 < furthest) ? 1 : 0;
  m.step = furthest;
  m.copy = behind > 0;
  m.why = absl::StrCat("group(s) ", absl::StrJoin(left, ", "), " lost; groups ", GroupList(m.groups), " go on at step ",
                       m.step, m.copy ? absl::StrCat(", state from group ", m.source) : "");
  return Publish(m);
}

Status ReplicaGroups::Recover(Engine& engine, const Status& step_error) {
  Store& store = *opt_.store;
  if (!step_error.GetPayload(internal::kReplicaLostPayload).has_value() || epoch_.epoch == 0) {
    // This group's own communicator broke: the others need not wait for it.
    (void)store.Add(Key(absl::StrCat("lost.", group_, ".", opt_.incarnation)), 1);
    return step_error;
  }
  engine.impl_->DropJobComms();
  world_comm_.reset();
  const int64_t step = engine.steps();
  const absl::Time deadline = absl::Now() + DecideTimeout() + opt_.comm.timeout;
  for (int64_t e = epoch_.epoch + 1;; ++e) {
    if (shard_rank_ == 0) {
      ZERO_RETURN_IF_ERROR(store.Add(Key(absl::StrCat("alive.", e, ".", group_)), step + 1).status());
      ZERO_ASSIGN_OR_RETURN(const int64_t claim, store.Add(Key(absl::StrCat("claim.", e)), 1));
      if (claim == 1) ZERO_RETURN_IF_ERROR(DecideAfterFailure(e));
    }
    StatusOr<Membership> m = WaitForEpoch(e, deadline);
    if (!m.ok()) {
      return Status(m.status().code(), absl::StrCat("ReplicaGroups::Recover: group ", group_, " after: ",
                                                    step_error.message(), "; no decision: ", m.status().message()));
    }
    if (!m->after_failure) continue;  // an admission the failure made void: the decision after it
    for (size_t i = 0; i < m->groups.size(); ++i) {
      if (m->groups[i] == group_ && m->incarnations[i] == opt_.incarnation) return Apply(engine, *m);
    }
    (void)store.Add(Key(absl::StrCat("lost.", group_, ".", opt_.incarnation)), 1);
    return absl::AbortedError(absl::StrCat("ReplicaGroups::Recover: group ", group_, " was left out of epoch ", e, " (",
                                           m->why, "); its ranks must restart and rejoin"));
  }
}

}  // namespace zero
