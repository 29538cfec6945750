// The rendezvous agreement on the job and the world size (comm/internal/rendezvous.h).
#include "comm/internal/rendezvous.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace zero::internal {
namespace {

// FNV-1a: stable across processes and builds, unlike std::hash; the id itself may hold any byte, a store key not.
uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::vector<uint8_t> Bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }
std::string Text(const std::vector<uint8_t>& b) { return std::string(b.begin(), b.end()); }

// How an id appears in messages: quoted, with control characters escaped (ids come from the environment).
std::string ShowId(const std::string& id) {
  if (id.empty()) return "(none)";
  std::string out = "'";
  for (unsigned char c : id) {
    if (c < 0x20 || c == 0x7f || c == '\'' || c == '\\') {
      absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "'";
}

constexpr const char* kIdSources = "ZERO_JOB_ID, TORCHELASTIC_RUN_ID or SLURM_JOB_ID (zero-run sets ZERO_JOB_ID)";

StatusOr<int> WorldOf(const std::vector<uint8_t>& record, const std::string& key) {
  int world = 0;
  if (!absl::SimpleAtoi(Text(record), &world)) {
    return absl::InternalError(absl::StrCat("rendezvous: store key '", key, "' holds '", Text(record),
                                            "', not a world size (another program's keys in this store?)"));
  }
  return world;
}

std::string WorldMismatch(int rank, int world, int other_rank, int other_world) {
  return absl::StrCat("the ranks disagree on the world size: rank ", rank, " was started with world size ", world,
                      ", rank ", other_rank, " with ", other_world,
                      " (every rank of a job needs the same WORLD_SIZE, or the launcher's equivalent)");
}

}  // namespace

std::string JobScope(const std::string& prefix, const std::string& job_id) {
  if (job_id.empty()) return prefix;
  return absl::StrCat(prefix, "/job-", absl::Hex(Fnv1a(job_id), absl::kZeroPad16));
}

Status AgreeAtRendezvous(Store& store, const std::string& prefix, const std::string& key_prefix, int rank, int world,
                         const std::string& job_id, absl::Duration timeout) {
  // Every wait gets the whole timeout, as every wait of Gloo's own rendezvous does (BoundedStore): ranks that
  // start seconds apart (a loaded machine, a slow file system) still meet.
  const std::string job_key = absl::StrCat(prefix, "/job");
  const std::string where = absl::StrCat("rank ", rank, " of ", world, ", job ", ShowId(job_id));
  // The job: the first rank 0 on this store claims it; every rank compares its id with the claim.
  // Stored with a prefix: Gloo's FileStore cannot hold an empty value (a job without an id).
  if (rank == 0) {
    Status s = store.Set(job_key, Bytes("job:" + job_id));
    if (!s.ok() && !absl::IsAlreadyExists(s)) return s;
  }
  StatusOr<std::vector<uint8_t>> served = store.Get(job_key, timeout);
  if (!served.ok()) {
    return Status(
        served.status().code(),
        absl::StrCat("rendezvous (", where, "): rank 0 never said which job it serves: ", served.status().message()));
  }
  std::string served_id = Text(*served);
  if (served_id.rfind("job:", 0) == 0) served_id = served_id.substr(4);
  if (served_id != job_id) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rendezvous (", where, "): this rank belongs to job ", ShowId(job_id),
        " but the store (MASTER_ADDR:", "MASTER_PORT or ZERO_STORE_DIR) is served by job ", ShowId(served_id),
        "; ranks of different jobs refuse each other. Give every job its own MASTER_PORT or store directory; ",
        "the job id comes from ", kIdSources));
  }
  if (world == 1) return absl::OkStatus();
  // The world size: each rank posts its own, compares with rank 0's; rank 0 compares everyone's and publishes a
  // verdict, so that ranks that agree with rank 0 fail too when another does not.
  const std::string agree = absl::StrCat(key_prefix, "/agree/");
  ZERO_RETURN_IF_ERROR(store.Set(absl::StrCat(agree, rank), Bytes(std::to_string(world))));
  if (rank == 0) {
    std::string verdict = "ok";
    Status failed;
    for (int r = 1; r < world && failed.ok(); ++r) {
      const std::string key = absl::StrCat(agree, r);
      StatusOr<std::vector<uint8_t>> rec = store.Get(key, timeout);
      if (!rec.ok()) {
        failed = Status(rec.status().code(),
                        absl::StrCat("rendezvous (", where, "): rank ", r, " never arrived: ", rec.status().message()));
        verdict = std::string(failed.message());
        break;
      }
      StatusOr<int> w = WorldOf(*rec, key);
      if (!w.ok()) {
        failed = w.status();
      } else if (*w != world) {
        failed =
            absl::FailedPreconditionError(absl::StrCat("rendezvous (", where, "): ", WorldMismatch(0, world, r, *w)));
      }
      if (!failed.ok()) verdict = std::string(failed.message());
    }
    // Published even when this rank failed, so that the others fail at once with the cause (and its code).
    (void)store.Set(absl::StrCat(agree, "verdict"),
                    Bytes(failed.ok() ? verdict : absl::StrCat(static_cast<int>(failed.code()), ":", verdict)));
    return failed;
  }
  const std::string zero_key = absl::StrCat(agree, 0);
  StatusOr<std::vector<uint8_t>> rec0 = store.Get(zero_key, timeout);
  if (!rec0.ok()) {
    return Status(rec0.status().code(),
                  absl::StrCat("rendezvous (", where, "): rank 0 never arrived: ", rec0.status().message()));
  }
  ZERO_ASSIGN_OR_RETURN(int world0, WorldOf(*rec0, zero_key));
  if (world0 != world) {
    return absl::FailedPreconditionError(
        absl::StrCat("rendezvous (", where, "): ", WorldMismatch(rank, world, 0, world0)));
  }
  // Rank 0 may take the whole timeout to find a missing rank: wait a little longer for what it says.
  const absl::Duration grace = std::min(timeout / 2, absl::Seconds(5));
  StatusOr<std::vector<uint8_t>> verdict = store.Get(absl::StrCat(agree, "verdict"), timeout + grace);
  if (!verdict.ok()) {
    return Status(verdict.status().code(),
                  absl::StrCat("rendezvous (", where,
                               "): rank 0 gave no verdict (it waits for every rank: a rank never arrived, or rank 0 "
                               "died): ",
                               verdict.status().message()));
  }
  const std::string text = Text(*verdict);
  if (text == "ok") return absl::OkStatus();
  // "<code>:<message>"
  int code = static_cast<int>(absl::StatusCode::kFailedPrecondition);
  std::string message = text;
  if (const size_t colon = text.find(':');
      colon != std::string::npos && absl::SimpleAtoi(text.substr(0, colon), &code)) {
    message = text.substr(colon + 1);
  }
  return Status(static_cast<absl::StatusCode>(code),
                absl::StrCat("rendezvous (", where, "): rank 0 refused the rendezvous: ", message));
}

}  // namespace zero::internal
