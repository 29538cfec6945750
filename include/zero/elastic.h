// zero/elastic.h — live recovery across replica groups: when a rank dies or hangs, its replica group leaves and
// the other groups train on at the next step, with no checkpoint and no restart; a restarted group rejoins at a
// step boundary by copying parameters and optimizer state from a healthy group over the network.
//
//   auto groups = zero::ReplicaGroups::FromEnv(config);          // RANK, WORLD_SIZE, ZERO_STORE_DIR (zero-run)
//   auto engine = zero::Engine::Create(config, (*groups)->group_comm());
//   ... AddUnit, Finalize ...
//   ZERO_RETURN_IF_ERROR((*groups)->Join(*engine));              // the first time: forms the job
//   while (engine->steps() < total) {
//     ZERO_RETURN_IF_ERROR((*groups)->AtStepBoundary(*engine));  // admits groups that are waiting
//     ... forward and backward, engine->config().accumulation_steps() micro-steps ...
//     StatusOr<StepResult> r = engine->Step();
//     if (!r.ok()) { ZERO_RETURN_IF_ERROR((*groups)->Recover(*engine, r.status())); continue; }  // run it again
//   }
//
// This is hybrid sharding (zero_optimization.mics_shard_size = G) over groups that come and go: each group of G
// ranks shards the model within itself, and the groups present all-reduce the gradient shards. The Engine is
// created over the group's own communicator; Join and every later change of membership hand it the job-wide
// one. A group is the unit of failure: a rank that fails takes its group with it (its shard is gone), and a
// launcher restarts the whole group (zero-run --live-groups G).
//
// Membership is decided in the Store, never in a training process: an epoch is a numbered, write-once decision
// (which groups and incarnations, from which step, whose state the others copy), claimed by exactly one rank.
// zero-run keeps the store in a folder (ZERO_STORE_DIR), which outlives any rank; across machines it must be a
// folder every host shares. A TCP store served by rank 0 is refused: it dies with rank 0. If the store's host
// or folder is lost, the job stops as a job whose launcher died does.
//
// A step: the groups present all-reduce their gradient shards (the engine's step); when that all-reduce fails on
// any rank of a group, the group drops the step on all its ranks (Engine::Step returns kAborted) and Recover
// waits for the epoch that leaves the lost group out, then the trainer runs the step again. The global batch is
// the groups present times the per-group batch: the config must keep the accumulation steps at every world
// size (elastic_batch.policy "keep_micro", whose lr_scaling then follows the world; or no train_batch_size).
// Every decision is logged on every rank (INFO) and kept in history().
//
// Not covered: a failure of every group at once (the checkpoint is the way back), a whole group's ranks on
// several hosts losing the store, the CUDA engine (the state copy runs over Gloo), ShardedOptimizer.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/engine.h"
#include "zero/status.h"
#include "zero/store.h"

namespace zero {

struct LiveOptions {
  std::shared_ptr<Store> store;  // shared by every rank of every group, and outliving all of them
  int rank = 0;                  // this process's slot in the whole job (RANK): group rank / group_size
  int world_size = 0;            // every group's ranks (WORLD_SIZE)
  int group_size = 0;            // G: the config's zero_optimization.mics_shard_size
  int incarnation = 0;           // how often this group was started before (ZERO_GROUP_RESTART_COUNT)
  CommOptions comm;              // timeout (comm_timeout_s), job id, hostname; the prefix is set per epoch
  // How long a group waits to be admitted (Join), and how long the ranks that lost a group wait for the others
  // to say whether they are still there before deciding without them (Recover): 0 = 2 × comm timeout.
  absl::Duration join_timeout = absl::Minutes(10);
  absl::Duration decide_timeout = absl::ZeroDuration();
  // The op timeout of the job-wide communicator (the all-reduce across groups): 0 = a third of comm.timeout.
  // Shorter than the group's own, so that a rank whose all-reduce across groups failed reaches its group's vote
  // on the step before the group-mates already waiting there time out.
  absl::Duration replica_timeout = absl::ZeroDuration();
};

// One decision: from step `step`, the groups `groups` (their incarnations beside them) train together.
struct Membership {
  int64_t epoch = 0;
  std::vector<int> groups;
  std::vector<int> incarnations;
  int64_t step = 0;
  bool after_failure = false;  // decided by Recover (a group was lost), else an admission at a step boundary
  bool copy = false;           // the groups' state was copied from `source` (bitwise)
  int source = -1;
  int64_t joins_covered = 0;  // the join announcements (a counter in the store) this decision took in
  std::string why;            // the log line: who is in, who left, who came, where the state came from
};

class ReplicaGroups {
 public:
  // From the launcher's variables: RANK and WORLD_SIZE (or torchrun's / Slurm's, as Communicator::FromEnv),
  // ZERO_STORE_DIR, ZERO_GROUP_RESTART_COUNT (zero-run sets it per group; else TORCHELASTIC_RESTART_COUNT);
  // the group size is `config`'s mics_shard_size and the timeout its comm_timeout_s.
  static StatusOr<std::unique_ptr<ReplicaGroups>> FromEnv(const Config& config);
  // Builds this group's communicator (a rendezvous of the group's ranks only).
  static StatusOr<std::unique_ptr<ReplicaGroups>> Create(LiveOptions options);
  ~ReplicaGroups();

  // This group's ranks: create the Engine over it (the engine shards across it).
  std::shared_ptr<Communicator> group_comm() const { return group_comm_; }
  // After Finalize: waits until this group is admitted (the first launch: until every group is there), then
  // regroups the engine and takes the state of a group already training. Collective over the groups admitted.
  // kCancelled when the job finished before this group was admitted (Leave), kDeadlineExceeded after
  // LiveOptions::join_timeout.
  Status Join(Engine& engine);
  // Before each step's first forward, on every rank: a rank of the lowest group admits the groups waiting to
  // join, from the next step; every rank applies such a decision at the step it names.
  Status AtStepBoundary(Engine& engine);
  // After Engine::Step failed. OK when the failure was the loss of another group: the step was dropped on this
  // group's ranks, the groups left are re-formed (and the state of the group furthest ahead copied to any
  // behind it), and the trainer runs the step again. Any other error — this group's own communicator failed —
  // is marked in the store (so the others need not wait for it) and returned: this group's ranks must exit
  // and be restarted.
  Status Recover(Engine& engine, const Status& step_error);

  // When this rank is done training (the last step): the first rank of the world says the job is over, so that
  // a group still waiting in Join stops waiting (Join returns kCancelled). Not collective.
  Status Leave();

  int group() const { return group_; }
  int world_rank() const;                                      // in the job-wide communicator of the current epoch
  int world_size() const;                                      // the ranks of the groups present
  int launched_world_size() const { return opt_.world_size; }  // every group's ranks (WORLD_SIZE)
  int64_t epoch() const { return epoch_.epoch; }
  const Membership& membership() const { return epoch_; }
  const std::vector<Membership>& history() const { return history_; }
  // The global samples the job trained in steps [0, step) when every rank of the groups present trains
  // `samples_per_rank` per step (micro-batch × accumulation): the data cursor of a trainer whose global batch
  // follows the groups present (the accumulation cannot change, so the global batch does). Step k counts with the
  // groups of the last decision taken for a step at or before k — a later decision for an earlier step (a loss
  // before an admission took effect) overrides the earlier one. Every rank computes the same number, a group that
  // rejoined included: each rank knows every decision up to the one it trains in. Steps before the job formed
  // count with the first decision's groups.
  int64_t SamplesBefore(int64_t step, int64_t samples_per_rank) const;

 private:
  explicit ReplicaGroups(LiveOptions options);
  // Regroups the engine into `m`: the rendezvous of every rank `m` names, the engine's new job-wide
  // communicator, and the state copy when `m` asks for it.
  Status Apply(Engine& engine, const Membership& m);
  // Decision `e` once it is published (kDeadlineExceeded at `deadline`).
  StatusOr<Membership> WaitForEpoch(int64_t e, absl::Time deadline);
  // The claimant of epoch `e` after a failure: waits until every group of the current epoch said it is alive or
  // lost (or the decide timeout), then publishes who goes on.
  Status DecideAfterFailure(int64_t e);
  // The join announcements after `covered`, as (group, incarnation).
  StatusOr<std::vector<std::pair<int, int>>> Joiners(int64_t covered, int64_t upto);
  Status Publish(const Membership& m);
  // Reads every decision before epoch `e` this rank has not seen (SamplesBefore needs them all).
  Status LearnDecisionsBefore(int64_t e);
  absl::Duration DecideTimeout() const;

  LiveOptions opt_;
  int group_ = 0, shard_rank_ = 0;
  std::shared_ptr<Communicator> group_comm_, world_comm_;
  Membership epoch_;           // the epoch this rank trains in (epoch 0: not admitted yet)
  int64_t joins_covered_ = 0;  // join announcements the current epoch took in
  std::vector<Membership> history_;
  std::map<int64_t, Membership> decisions_;  // every decision this rank read or wrote, by epoch
};

}  // namespace zero
