// zero-bench-comm: collective bandwidth of zero::Communicator beside the raw engine call on the same buffers.
//
//   zero-bench-comm --world 4 [--backend gloo|nccl] [--json] [--min-bytes 1K] [--max-bytes 256M] [--iters N]
//                   [--ops ag,rs,rsd,ar] [--aa] [--only zero|raw] [--chunk BYTES]
//
// Ranks are threads of this process (Gloo: one communicator each over a HashStore, TCP on 127.0.0.1; NCCL: one
// GPU each, so --world must not exceed the device count). For each size it first runs zero's op once on
// closed-form inputs and counts wrong elements (#wrong), then times zero's op and the raw engine call
// alternately, iteration by iteration, so both see the same machine noise:
//   raw AllGather      gloo::allgather (UnboundBuffer API)          | ncclAllGather
//   raw ReduceScatter  gloo::ReduceScatterHalvingDoubling<float>::run, constructed once, on the send buffer
//                      (it reduces in place and clobbers its input)  | ncclReduceScatter
//   raw AllReduce      gloo::allreduce, RING, in place               | ncclAllReduce
// RS-destructive is zero's ReduceScatterDestructive (input used as scratch; no staging copy on Gloo f32) beside
// the same raw reduce-scatter. Its check pass refills the input before the one checked call.
// Gloo's raw calls run on contexts of their own (one per API family) over a TCP device of their own, not on
// the communicator's. --aa (A/A control) times the raw call in zero's place: for Gloo over a second such set of
// contexts and device, so that it differs from the raw column in what zero's call differs in (its connections
// and the device's event-loop thread); for NCCL on the same communicator.
//
// Columns follow nccl-tests: size = bytes of the full buffer (AllGather output, ReduceScatter input,
// AllReduce buffer), count = its elements, time = median over iterations of the slowest rank's time for one op
// (host wall clock from issue to completion; NCCL: to the end of the op on its stream), algbw = size / time,
// busbw = algbw * (n-1)/n (AllGather, ReduceScatter) or 2(n-1)/n (AllReduce). raw_time and raw_busbw are the
// same for the raw call; ratio = the median over iterations of raw_time_i / time_i, each pair timed back to
// back (close to busbw / raw_busbw, less sensitive to a busy machine).
//
// --chunk BYTES (Gloo): zero's AllGather and ReduceScatter are the engine's chunked collectives of a unit larger than
// its bucket (shard/internal/collective.h: chunks of at most BYTES — all ranks' blocks together — each rank keeping
// its contiguous shard, two staging buffers, the reduce-scatter packing every rank's range and averaging), and the
// raw call is Gloo's moving the same chunks through the same buffers: one call per chunk, each on a contiguous
// chunk-sized stretch of the unit (the all-gather of each chunk's inputs from the shard into the unit's buffer; the
// reduce-scatter in place on the unit's gradient buffer, one Gloo instance per chunk position, since Gloo's class
// is bound to its buffer), so each rank's result ends up scattered over the unit, not contiguous, and nothing is
// averaged. Both sides read and write the same memory: the ratio is what zero adds to Gloo for a chunked unit.
// --raw-chunk-buffer is the comparator of earlier sessions: the raw calls all run on one chunk-sized buffer that
// stays hot in cache (the reduce-scatter never reads the unit at all), which flatters Gloo by the cache effect.
// What chunking itself costs against one call on the whole buffer is Gloo's own per-size bandwidth, which the
// plain rows show. Rows are named AG/chunked and RS/chunked; rs and rsd are the same op there.
//
// --only zero|raw times one of the two calls and never runs the other (ratio and the other time print as 0):
// two processes, one per call, see no trace of each other, a cross-check that interleaving does not move cost
// from one call into the other's window (a thread woken by one op that only gets a core during the next one
// would). bench/scripts/comm_separate.sh alternates such processes and pairs them.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/math.h"
#include "gloo/reduce_scatter.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"
#include "shard/internal/collective.h"
#include "shard/internal/context.h"
#include "shard/internal/plan.h"
#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/features.h"

#if ZERO_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

namespace {

enum class Op { kAllGather, kReduceScatter, kReduceScatterDestructive, kAllReduce };
const char* OpName(Op op) {
  switch (op) {
    case Op::kAllGather: return "AllGather";
    case Op::kReduceScatter: return "ReduceScatter";
    case Op::kReduceScatterDestructive: return "RS-destructive";
    case Op::kAllReduce: return "AllReduce";
  }
  return "?";
}
bool IsRs(Op op) { return op == Op::kReduceScatter || op == Op::kReduceScatterDestructive; }
double BusFactor(Op op, int n) { return op == Op::kAllReduce ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n; }

struct Args {
  int world = 4;
  std::string backend = "gloo";
  bool json = false;
  size_t min_bytes = size_t{1} << 10;
  size_t max_bytes = size_t{256} << 20;
  int iters = 0;                  // 0 = by size
  bool aa = false;                // A/A control: time the raw call in place of zero's, to show the measurement's noise
  std::string only;               // "zero" or "raw": time only that call
  size_t chunk = 0;               // --chunk: bytes per chunk of the engine's chunked collectives (0: zero's plain ops)
  bool raw_chunk_buffer = false;  // --raw-chunk-buffer: the raw calls run on one hot chunk-sized buffer
  std::vector<Op> ops = {Op::kAllGather, Op::kReduceScatter, Op::kReduceScatterDestructive, Op::kAllReduce};
};

size_t ParseBytes(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  switch (end != nullptr ? *end : '\0') {
    case 'K':
    case 'k': v *= 1024; break;
    case 'M':
    case 'm': v *= 1024 * 1024; break;
    case 'G':
    case 'g': v *= 1024.0 * 1024 * 1024; break;
    default: break;
  }
  return static_cast<size_t>(v);
}

void PrintUsage(FILE* out) {
  std::fprintf(out,
               "usage: zero-bench-comm --world N [--backend gloo|nccl] [--json] [--min-bytes B] [--max-bytes B]\n"
               "                       [--iters N] [--ops ag,rs,rsd,ar] [--aa] [--only zero|raw]\n"
               "  --aa  A/A control: the 'time' column times the raw call too, over its own connections (Gloo) as\n"
               "        zero's communicator has, so ratio shows the noise of the method\n"
               "  --only zero|raw  time only one of the two calls (the other's columns and ratio print 0)\n"
               "  --chunk B  (gloo) zero's AllGather/ReduceScatter are the engine's chunked collectives, chunks of B\n"
               "  --raw-chunk-buffer  (with --chunk) the raw calls run on one chunk-sized buffer, not on the unit's\n");
}

// A usage error: what is wrong (when known), then the usage, on stderr; exit 2.
[[noreturn]] void Usage(const std::string& why = "") {
  if (!why.empty()) std::fprintf(stderr, "zero-bench-comm: %s\n", why.c_str());
  PrintUsage(stderr);
  std::exit(2);
}

Args ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    // Called only for a known flag, so an unknown last flag is named as unknown rather than as missing a value.
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(k + " needs a value");
      return argv[++i];
    };
    if (k == "--help" || k == "-h") {
      PrintUsage(stdout);
      std::exit(0);
    } else if (k == "--world") a.world = std::atoi(value().c_str());
    else if (k == "--backend") a.backend = value();
    else if (k == "--json") a.json = true;
    else if (k == "--aa") a.aa = true;
    else if (k == "--only") a.only = value();
    else if (k == "--min-bytes") a.min_bytes = ParseBytes(value());
    else if (k == "--max-bytes") a.max_bytes = ParseBytes(value());
    else if (k == "--iters") a.iters = std::atoi(value().c_str());
    else if (k == "--chunk") a.chunk = ParseBytes(value());
    else if (k == "--raw-chunk-buffer") a.raw_chunk_buffer = true;
    else if (k == "--ops") {
      a.ops.clear();
      for (absl::string_view o : absl::StrSplit(value(), ',')) {
        if (o == "ag") a.ops.push_back(Op::kAllGather);
        else if (o == "rs") a.ops.push_back(Op::kReduceScatter);
        else if (o == "rsd") a.ops.push_back(Op::kReduceScatterDestructive);
        else if (o == "ar") a.ops.push_back(Op::kAllReduce);
        else Usage("--ops: unknown op " + std::string(o) + " (ag, rs, rsd, ar)");
      }
    } else {
      Usage("unknown flag " + k);
    }
  }
  if (a.world < 1 || (a.backend != "gloo" && a.backend != "nccl") || a.min_bytes < 4 || a.max_bytes < a.min_bytes ||
      !(a.only.empty() || a.only == "zero" || a.only == "raw") || (!a.only.empty() && a.aa) ||
      (a.chunk > 0 && a.backend != "gloo") || (a.raw_chunk_buffer && a.chunk == 0)) {
    Usage();
  }
  return a;
}

// Bytes per element is 4 (f32) throughout; element counts per rank must divide evenly.
size_t ElementsFor(size_t bytes, int world) { return std::max<size_t>(bytes / 4 / world, 1) * world; }

int ItersFor(const Args& a, size_t bytes) {
  if (a.iters > 0) return a.iters;
  // About 1 GiB of traffic per measurement, between 21 and 201 iterations (odd: a true median). Paired ratios
  // on a shared 2-core host spread about +-10 % over 11-51 iterations and +-3.5 % over 501 (A/A control at
  // 1-4 MiB, bench/results/comm-gloo-world4.md); this is the middle ground that keeps a full sweep in minutes.
  return static_cast<int>(std::clamp<size_t>((size_t{1} << 30) / bytes, 21, 201)) | 1;
}

// What each rank thread does for one measurement; the driver is backend-independent.
class RankBackend {
 public:
  virtual ~RankBackend() = default;
  // Allocates buffers for `total` elements (the full buffer of `op`).
  virtual void Prepare(Op op, size_t total) = 0;
  // Fills closed-form inputs, runs zero's op once, returns the number of wrong elements on this rank.
  virtual long Check(Op op, size_t total) = 0;
  // One timed call each; return seconds.
  virtual double TimeZero(Op op, size_t total) = 0;
  virtual double TimeRaw(Op op, size_t total) = 0;
  // --aa: the raw call again, in place of zero's, over resources as separate from TimeRaw's as zero's are.
  virtual double TimeControl(Op op, size_t total) { return TimeRaw(op, total); }
};

// Input element i of rank r, and the reduced and gathered values, exact in f32.
float InputValue(int r, size_t i) { return static_cast<float>((r + 1) * (i % 13 + 1)); }
float SumValue(int world, size_t i) { return static_cast<float>(world * (world + 1) / 2 * (i % 13 + 1)); }

// ---------------------------------------------------------------------------------------------------------
// Gloo

class GlooRank final : public RankBackend {
 public:
  GlooRank(int rank, int world, std::shared_ptr<zero::Store> store, bool aa, size_t chunk_bytes, bool raw_chunk_buffer)
      : rank_(rank), world_(world), chunk_elems_(chunk_bytes / 4), raw_chunk_buffer_(raw_chunk_buffer) {
    zero::CommOptions o;
    o.hostname = "127.0.0.1";
    o.timeout = absl::Seconds(300);
    auto c = zero::Communicator::CreateGloo(store, rank, world, o);
    if (!c.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, zero::ErrorText(c.status()).c_str());
      std::exit(1);
    }
    comm_ = std::move(*c);
    if (chunk_elems_ > 0) {
      // The engine's context and staging pool, over this communicator and host memory, for its chunked ops.
      ctx_ = std::make_unique<zero::internal::EngineContext>(zero::Config::Default(), comm_, nullptr, nullptr,
                                                             zero::EngineOptions{});
      ctx_->compute = zero::internal::MakeHostCompute(&ctx_->tracker);
      pool_ = std::make_unique<zero::internal::BufferPool>(ctx_->compute, zero::MemTag::kStaging);
    }
    if (world_ > 1) {
      raw_.Connect(rank, world, *store, "bench/raw");
      if (aa) control_.Connect(rank, world, *store, "bench/control");
    }
  }

  void Prepare(Op op, size_t total) override {
    send_.assign(op == Op::kAllGather ? total / world_ : total, 0.f);
    recv_.assign(IsRs(op) ? total / world_ : total, 0.f);
    // --chunk: the raw call moves the same chunks, through the unit's buffers (or one chunk-sized buffer).
    raw_chunk_ = chunk_elems_ > 0 && op != Op::kAllReduce
                     ? zero::internal::ChunkPerRank(static_cast<int64_t>(total), world_, chunk_elems_)
                     : 0;
    const bool in_unit = raw_chunk_ > 0 && !raw_chunk_buffer_;
    const size_t raw_total = raw_chunk_ > 0 ? static_cast<size_t>(raw_chunk_) * world_ : total;
    raw_buf_.assign(raw_chunk_ > 0 && !in_unit ? raw_total : 0, 0.f);
    for (RawGloo* raw : {&raw_, &control_}) {
      raw->rs_algo.reset();
      raw->rs_chunks.clear();
      if (IsRs(op) && raw->rs != nullptr && in_unit) {
        // Gloo's class is bound to its buffer: one instance per chunk position of the unit's gradient buffer.
        const size_t block = total / world_, c = static_cast<size_t>(raw_chunk_);
        for (size_t a = 0; a < block; a += c) {
          const size_t n = std::min(c, block - a);
          raw->rs_chunks.push_back(std::make_unique<gloo::ReduceScatterHalvingDoubling<float>>(
              raw->rs, std::vector<float*>{send_.data() + a * world_}, static_cast<int>(n * world_),
              std::vector<int>(world_, static_cast<int>(n))));
        }
      } else if (IsRs(op) && raw->rs != nullptr) {
        raw->rs_algo = std::make_unique<gloo::ReduceScatterHalvingDoubling<float>>(
            raw->rs, std::vector<float*>{raw_chunk_ > 0 ? raw_buf_.data() : send_.data()}, static_cast<int>(raw_total),
            std::vector<int>(world_, static_cast<int>(raw_total / world_)));
      }
    }
  }

  long Check(Op op, size_t total) override {
    const size_t block = total / world_;
    long wrong = 0;
    switch (op) {
      case Op::kAllGather:
        for (size_t i = 0; i < block; ++i) send_[i] = InputValue(rank_, i);
        if (chunk_elems_ > 0) {
          RunChunked(op, total);
        } else {
          Run(comm_->AllGather(send_.data(), recv_.data(), block, zero::DType::kF32));
        }
        for (int r = 0; r < world_; ++r) {
          for (size_t i = 0; i < block; ++i) wrong += recv_[r * block + i] != InputValue(r, i);
        }
        break;
      case Op::kReduceScatter:
      case Op::kReduceScatterDestructive:
        for (size_t i = 0; i < total; ++i) send_[i] = InputValue(rank_, i);
        if (chunk_elems_ > 0) {
          RunChunked(op, total);  // averages: the engine's reduction
          for (size_t i = 0; i < block; ++i) {
            wrong += recv_[i] != SumValue(world_, rank_ * block + i) / static_cast<float>(world_);
          }
          break;
        }
        Run(ZeroReduceScatter(op, block));
        for (size_t i = 0; i < block; ++i) wrong += recv_[i] != SumValue(world_, rank_ * block + i);
        break;
      case Op::kAllReduce:
        for (size_t i = 0; i < total; ++i) recv_[i] = InputValue(rank_, i);
        Run(comm_->AllReduce(recv_.data(), total, zero::DType::kF32, zero::ReduceOp::kSum));
        for (size_t i = 0; i < total; ++i) wrong += recv_[i] != SumValue(world_, i);
        break;
    }
    return wrong;
  }

  double TimeZero(Op op, size_t total) override {
    const size_t block = total / world_;
    const absl::Time t0 = absl::Now();
    if (chunk_elems_ > 0 && op != Op::kAllReduce) {
      RunChunked(op, total);
      return absl::ToDoubleSeconds(absl::Now() - t0);
    }
    switch (op) {
      case Op::kAllGather: Run(comm_->AllGather(send_.data(), recv_.data(), block, zero::DType::kF32)); break;
      case Op::kReduceScatter:
      case Op::kReduceScatterDestructive: Run(ZeroReduceScatter(op, block)); break;
      case Op::kAllReduce: Run(comm_->AllReduce(recv_.data(), total, zero::DType::kF32, zero::ReduceOp::kSum)); break;
    }
    return absl::ToDoubleSeconds(absl::Now() - t0);
  }

  double TimeRaw(Op op, size_t total) override { return TimeGloo(raw_, op, total); }
  double TimeControl(Op op, size_t total) override { return TimeGloo(control_, op, total); }

 private:
  // Raw Gloo: its own TCP device and one context per API family, as zero's communicator has.
  struct RawGloo {
    void Connect(int rank, int world, zero::Store& store, const std::string& prefix) {
      gloo::transport::tcp::attr attr;
      attr.hostname = "127.0.0.1";
      device = gloo::transport::tcp::CreateDevice(attr);
      auto* native = static_cast<gloo::rendezvous::Store*>(store.NativeHandle());
      for (auto* ctx : {&fn, &rs}) {
        *ctx = std::make_shared<gloo::rendezvous::Context>(rank, world);
        (*ctx)->setTimeout(std::chrono::seconds(300));
        gloo::rendezvous::PrefixStore ps(prefix + (ctx == &fn ? "_fn" : "_rs"), *native);
        (*ctx)->connectFullMesh(ps, device);
      }
    }
    std::shared_ptr<gloo::transport::Device> device;
    std::shared_ptr<gloo::rendezvous::Context> fn;
    std::shared_ptr<gloo::rendezvous::Context> rs;
    std::unique_ptr<gloo::ReduceScatterHalvingDoubling<float>> rs_algo;
    std::vector<std::unique_ptr<gloo::ReduceScatterHalvingDoubling<float>>> rs_chunks;  // --chunk, per position
  };

  double TimeGloo(RawGloo& raw, Op op, size_t total) {
    if (world_ == 1) return TimeZero(op, total);
    const size_t block = total / world_;
    const absl::Time t0 = absl::Now();
    if (raw_chunk_ > 0) {  // the same chunks, each one raw call on a stretch of the unit (or the chunk buffer)
      const size_t c = static_cast<size_t>(raw_chunk_);
      const bool in_unit = !raw_chunk_buffer_;
      for (size_t a = 0; a < block; a += c) {
        if (op == Op::kAllGather) {
          gloo::AllgatherOptions o(raw.fn);
          o.setTag(++raw_tag_);
          o.setInput(send_.data() + a, std::min(c, block - a));
          o.setOutput(in_unit ? recv_.data() + a * world_ : raw_buf_.data(), std::min(c, block - a) * world_);
          gloo::allgather(o);
        } else if (in_unit) {
          raw.rs_chunks[a / c]->run();
        } else {
          raw.rs_algo->run();  // (a shorter last chunk runs whole: at most one chunk more than zero moves)
        }
      }
      return absl::ToDoubleSeconds(absl::Now() - t0);
    }
    switch (op) {
      case Op::kAllGather: {
        gloo::AllgatherOptions o(raw.fn);
        o.setTag(++raw_tag_);
        o.setInput(send_.data(), block);
        o.setOutput(recv_.data(), total);
        gloo::allgather(o);
        break;
      }
      case Op::kReduceScatter:
      case Op::kReduceScatterDestructive: raw.rs_algo->run(); break;
      case Op::kAllReduce: {
        gloo::AllreduceOptions o(raw.fn);
        o.setTag(++raw_tag_);
        o.setOutput(recv_.data(), total);
        o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
        o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
        gloo::allreduce(o);
        break;
      }
    }
    return absl::ToDoubleSeconds(absl::Now() - t0);
  }

  zero::Work ZeroReduceScatter(Op op, size_t block) {
    if (op == Op::kReduceScatterDestructive) {
      return comm_->ReduceScatterDestructive(send_.data(), recv_.data(), block, zero::DType::kF32,
                                             zero::ReduceOp::kSum);
    }
    return comm_->ReduceScatter(send_.data(), recv_.data(), block, zero::DType::kF32, zero::ReduceOp::kSum);
  }

  void Run(zero::Work w) {
    zero::Status s = w.Wait();
    if (!s.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank_, zero::ErrorText(s).c_str());
      std::exit(1);
    }
  }

  // The engine's chunked collective over the whole buffer (one op when the buffer fits a chunk), issued and
  // joined as the engine does.
  void RunChunked(Op op, size_t total) {
    const int64_t S = static_cast<int64_t>(total / world_);
    const int64_t chunk = zero::internal::ChunkPerRank(static_cast<int64_t>(total), world_, chunk_elems_);
    zero::internal::UnitCollective c;
    if (op == Op::kAllGather) {
      c = chunk > 0 ? zero::internal::UnitCollective::AllGather(ctx_.get(), pool_.get(), send_.data(), recv_.data(), S,
                                                                chunk, zero::DType::kF32)
                    : zero::internal::UnitCollective(
                          ctx_.get(), comm_->AllGather(send_.data(), recv_.data(), S, zero::DType::kF32));
    } else {
      c = chunk > 0
              ? zero::internal::UnitCollective::ReduceScatter(ctx_.get(), pool_.get(), send_.data(), zero::DType::kF32,
                                                              recv_.data(), zero::DType::kF32, S, chunk)
              : zero::internal::UnitCollective(
                    ctx_.get(),
                    comm_->ReduceScatter(send_.data(), recv_.data(), S, zero::DType::kF32, zero::ReduceOp::kAvg));
    }
    zero::Status s = c.Join();
    c.ReleaseStaging();
    if (!s.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank_, zero::ErrorText(s).c_str());
      std::exit(1);
    }
  }

  const int rank_;
  const int world_;
  const int64_t chunk_elems_;
  const bool raw_chunk_buffer_;
  std::shared_ptr<zero::Communicator> comm_;
  std::unique_ptr<zero::internal::EngineContext> ctx_;  // --chunk only
  std::unique_ptr<zero::internal::BufferPool> pool_;
  RawGloo raw_;
  RawGloo control_;  // --aa only
  std::vector<float> send_, recv_;
  int64_t raw_chunk_ = 0;       // --chunk: elements per rank of the raw calls' chunks (0: one call)
  std::vector<float> raw_buf_;  // --chunk --raw-chunk-buffer: the raw calls' chunk-sized buffer
  uint32_t raw_tag_ = 0;
};

// ---------------------------------------------------------------------------------------------------------
// NCCL

#if ZERO_HAVE_CUDA
#define BENCH_CUDA(expr)                                                                          \
  do {                                                                                            \
    cudaError_t e_ = (expr);                                                                      \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)
#define BENCH_NCCL(expr)                                                                          \
  do {                                                                                            \
    ncclResult_t r_ = (expr);                                                                     \
    if (r_ != ncclSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, ncclGetErrorString(r_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

class NcclRank final : public RankBackend {
 public:
  NcclRank(int rank, int world, std::shared_ptr<zero::Store> store, const ncclUniqueId& raw_id)
      : rank_(rank), world_(world) {
    BENCH_CUDA(cudaSetDevice(rank));
    zero::CommOptions o;
    o.device = rank;
    o.timeout = absl::Seconds(300);
    auto c = zero::Communicator::CreateNccl(store, rank, world, o);
    if (!c.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, zero::ErrorText(c.status()).c_str());
      std::exit(1);
    }
    comm_ = std::move(*c);
    BENCH_NCCL(ncclCommInitRank(&raw_, world, raw_id, rank));
    BENCH_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~NcclRank() override {
    Free();
    ncclCommDestroy(raw_);
    cudaStreamDestroy(stream_);
  }

  void Prepare(Op op, size_t total) override {
    Free();
    send_n_ = op == Op::kAllGather ? total / world_ : total;
    recv_n_ = IsRs(op) ? total / world_ : total;
    BENCH_CUDA(cudaMalloc(&d_send_, send_n_ * 4));
    BENCH_CUDA(cudaMalloc(&d_recv_, recv_n_ * 4));
  }

  long Check(Op op, size_t total) override {
    const size_t block = total / world_;
    std::vector<float> in(op == Op::kAllReduce ? total : send_n_), out(recv_n_);
    for (size_t i = 0; i < in.size(); ++i) in[i] = InputValue(rank_, i);
    BENCH_CUDA(cudaMemcpy(op == Op::kAllReduce ? d_recv_ : d_send_, in.data(), in.size() * 4, cudaMemcpyHostToDevice));
    Run(Zero(op, total));
    BENCH_CUDA(cudaMemcpy(out.data(), d_recv_, out.size() * 4, cudaMemcpyDeviceToHost));
    long wrong = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      float want = op == Op::kAllGather ? InputValue(static_cast<int>(i / block), i % block)
                   : IsRs(op)           ? SumValue(world_, rank_ * block + i)
                                        : SumValue(world_, i);
      wrong += out[i] != want;
    }
    return wrong;
  }

  double TimeZero(Op op, size_t total) override {
    const absl::Time t0 = absl::Now();
    Run(Zero(op, total));
    return absl::ToDoubleSeconds(absl::Now() - t0);
  }

  double TimeRaw(Op op, size_t total) override {
    const size_t block = total / world_;
    const absl::Time t0 = absl::Now();
    switch (op) {
      case Op::kAllGather: BENCH_NCCL(ncclAllGather(d_send_, d_recv_, block, ncclFloat32, raw_, stream_)); break;
      case Op::kReduceScatter:
      case Op::kReduceScatterDestructive:
        BENCH_NCCL(ncclReduceScatter(d_send_, d_recv_, block, ncclFloat32, ncclSum, raw_, stream_));
        break;
      case Op::kAllReduce:
        BENCH_NCCL(ncclAllReduce(d_recv_, d_recv_, total, ncclFloat32, ncclSum, raw_, stream_));
        break;
    }
    BENCH_CUDA(cudaStreamSynchronize(stream_));
    return absl::ToDoubleSeconds(absl::Now() - t0);
  }

 private:
  zero::Work Zero(Op op, size_t total) {
    const size_t block = total / world_;
    switch (op) {
      case Op::kAllGather: return comm_->AllGather(d_send_, d_recv_, block, zero::DType::kF32, stream_);
      case Op::kReduceScatter:
        return comm_->ReduceScatter(d_send_, d_recv_, block, zero::DType::kF32, zero::ReduceOp::kSum, stream_);
      case Op::kReduceScatterDestructive:
        return comm_->ReduceScatterDestructive(d_send_, d_recv_, block, zero::DType::kF32, zero::ReduceOp::kSum,
                                               stream_);
      case Op::kAllReduce: return comm_->AllReduce(d_recv_, total, zero::DType::kF32, zero::ReduceOp::kSum, stream_);
    }
    return zero::Work();
  }
  void Run(zero::Work w) {
    zero::Status s = w.Wait();
    if (!s.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank_, zero::ErrorText(s).c_str());
      std::exit(1);
    }
  }
  void Free() {
    if (d_send_ != nullptr) cudaFree(d_send_);
    if (d_recv_ != nullptr) cudaFree(d_recv_);
    d_send_ = d_recv_ = nullptr;
  }

  const int rank_;
  const int world_;
  std::shared_ptr<zero::Communicator> comm_;
  ncclComm_t raw_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* d_send_ = nullptr;
  float* d_recv_ = nullptr;
  size_t send_n_ = 0, recv_n_ = 0;
};
#endif  // ZERO_HAVE_CUDA

// A reusable thread barrier that wakes every waiter at once (libstdc++'s std::barrier backs off with timed
// sleeps, which added milliseconds of skew between ranks and so to whichever op a late rank joined).
class ThreadBarrier {
 public:
  explicit ThreadBarrier(int n) : n_(n) {}
  void arrive_and_wait() {
    absl::MutexLock lock(&mu_);
    const uint64_t gen = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      return;
    }
    auto released = [&]() { return generation_ != gen; };
    mu_.Await(absl::Condition(&released));
  }

 private:
  const int n_;
  absl::Mutex mu_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

// The kernel's default TCP congestion control, which every loopback connection of this process uses ("?" if
// unreadable). Under BBR each connection keeps its own pacing-rate estimate, and on the 2-core development host
// two identical Gloo calls over two sets of connections read 0.80-1.23 of each other at 1-2 MiB for a whole
// run (bench/results/comm-gloo-world4.md); under cubic the same control read 0.95-1.05.
std::string TcpCongestionControl() {
  std::FILE* f = std::fopen("/proc/sys/net/ipv4/tcp_congestion_control", "r");
  if (f == nullptr) return "?";
  char buf[64] = {};
  const bool ok = std::fgets(buf, sizeof(buf), f) != nullptr;
  std::fclose(f);
  if (!ok) return "?";
  std::string cc(buf);
  while (!cc.empty() && (cc.back() == '\n' || cc.back() == ' ')) cc.pop_back();
  return cc;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = ParseArgs(argc, argv);
  const int world = args.world;
  auto store = zero::Store::Hash();

#if ZERO_HAVE_CUDA
  ncclUniqueId raw_id{};
  if (args.backend == "nccl") BENCH_NCCL(ncclGetUniqueId(&raw_id));
#else
  if (args.backend == "nccl") {
    std::fprintf(stderr, "zero-bench-comm: built without CUDA; --backend nccl is unavailable\n");
    return 2;
  }
#endif

  std::vector<size_t> sizes;
  for (size_t b = args.min_bytes; b <= args.max_bytes; b *= 2) sizes.push_back(b);

  // Per-measurement results, written by each rank and read by rank 0 after a barrier.
  std::vector<std::vector<double>> zero_t(world), raw_t(world);
  std::vector<long> wrong(world);
  ThreadBarrier sync(world);

  const std::string tcp_cc = args.backend == "gloo" ? TcpCongestionControl() : "n/a";
  if (tcp_cc == "bbr" && world > 1) {
    std::fprintf(stderr,
                 "zero-bench-comm: note: TCP congestion control is bbr; its per-connection pacing state "
                 "makes Gloo timings over different connections disagree for a whole run (check with --aa)\n");
  }
  if (!args.json) {
    std::printf(
        "# zero-bench-comm: backend %s, world %d, dtype f32, ranks = threads, tcp_cc %s; time = median over "
        "iterations of the slowest rank (us); ratio = median of paired raw_time/time%s%s\n",
        args.backend.c_str(), world, tcp_cc.c_str(),
        args.chunk > 0 ? absl::StrCat("; zero's AG/RS: the engine's chunked collectives, chunks of ", args.chunk,
                                      " bytes; raw: Gloo's call per chunk ",
                                      args.raw_chunk_buffer ? "on one chunk-sized buffer" : "on the unit's buffers")
                             .c_str()
                       : "",
        args.aa               ? "; A/A CONTROL: 'time' is the raw call too, over connections of its own"
        : args.only == "zero" ? "; ONLY ZERO'S CALL is run"
        : args.only == "raw"  ? "; ONLY THE RAW CALL is run"
                              : "");
    std::printf("# %-13s %12s %11s %5s %5s %11s %8s %8s %7s %11s %9s %6s\n", "op", "size", "count", "type", "redop",
                "time", "algbw", "busbw", "#wrong", "raw_time", "raw_busbw", "ratio");
    std::fflush(stdout);
  }

  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<RankBackend> rank;
#if ZERO_HAVE_CUDA
      if (args.backend == "nccl") rank = std::make_unique<NcclRank>(r, world, store, raw_id);
#endif
      if (rank == nullptr)
        rank = std::make_unique<GlooRank>(r, world, store, args.aa, args.chunk, args.raw_chunk_buffer);
      for (Op op : args.ops) {
        for (size_t bytes : sizes) {
          const size_t total = ElementsFor(bytes, world);
          const int iters = ItersFor(args, total * 4);
          rank->Prepare(op, total);
          sync.arrive_and_wait();
          wrong[r] = args.only == "raw" ? 0 : rank->Check(op, total);
          // Warm-up, the same number of calls for both (first-touch of pages, zero's reduce-scatter cache, Gloo's
          // raw algorithm, and the TCP connections of both: a connection that has carried fewer bytes is slower
          // for a while, which had made the raw call look slow at the first size of a run).
          for (int it = 0; it < std::max(3, iters / 10); ++it) {
            sync.arrive_and_wait();
            if (args.only != "raw") rank->TimeZero(op, total);
            sync.arrive_and_wait();
            if (args.only != "zero") rank->TimeRaw(op, total);
          }
          zero_t[r].assign(iters, 0);
          raw_t[r].assign(iters, 0);
          auto time_zero = [&] { return args.aa ? rank->TimeControl(op, total) : rank->TimeZero(op, total); };
          if (!args.only.empty()) {
            const bool zero = args.only == "zero";
            for (int it = 0; it < iters; ++it) {
              sync.arrive_and_wait();
              zero_t[r][it] = zero ? time_zero() : 0;
              raw_t[r][it] = zero ? 0 : rank->TimeRaw(op, total);
            }
          }
          for (int it = 0; it < iters && args.only.empty(); ++it) {
            // Alternate which call goes first so neither always follows the other.
            const bool zero_first = it % 2 == 0;
            sync.arrive_and_wait();
            double a = zero_first ? time_zero() : rank->TimeRaw(op, total);
            sync.arrive_and_wait();
            double b = zero_first ? rank->TimeRaw(op, total) : time_zero();
            zero_t[r][it] = zero_first ? a : b;
            raw_t[r][it] = zero_first ? b : a;
          }
          sync.arrive_and_wait();
          if (r == 0) {
            std::vector<double> zt(iters), rt(iters);
            long wrong_total = 0;
            for (int it = 0; it < iters; ++it) {
              for (int q = 0; q < world; ++q) {
                zt[it] = std::max(zt[it], zero_t[q][it]);
                rt[it] = std::max(rt[it], raw_t[q][it]);
              }
            }
            for (int q = 0; q < world; ++q) wrong_total += wrong[q];
            const double t = Median(zt), traw = Median(rt);
            // Each iteration timed both calls back to back, so their ratio cancels most machine drift; the
            // median of those paired ratios is the reported ratio.
            std::vector<double> paired(iters);
            for (int it = 0; it < iters; ++it) paired[it] = rt[it] / zt[it];
            const size_t size = total * 4;
            const double algbw = t > 0 ? size / t / 1e9 : 0, raw_algbw = traw > 0 ? size / traw / 1e9 : 0;
            const double busbw = algbw * BusFactor(op, world), raw_busbw = raw_algbw * BusFactor(op, world);
            const double ratio = !args.only.empty() ? 0 : Median(paired);
            const char* redop = op == Op::kAllGather ? "none" : args.chunk > 0 ? "avg" : "sum";
            const std::string name = args.chunk > 0 && op != Op::kAllReduce
                                         ? (op == Op::kAllGather ? "AG/chunked" : "RS/chunked")
                                         : OpName(op);
            if (args.json) {
              std::printf(
                  "{\"backend\":\"%s\",\"world\":%d,\"op\":\"%s\",\"dtype\":\"f32\",\"redop\":\"%s\","
                  "\"bytes\":%zu,\"count\":%zu,\"iters\":%d,\"time_us\":%.2f,\"algbw\":%.4f,\"busbw\":%.4f,"
                  "\"raw_time_us\":%.2f,\"raw_busbw\":%.4f,\"ratio\":%.4f,\"wrong\":%ld,\"aa_control\":%s,"
                  "\"only\":\"%s\",\"tcp_cc\":\"%s\",\"chunk_bytes\":%zu,\"raw_buffer\":\"%s\"}\n",
                  args.backend.c_str(), world, name.c_str(), redop, size, total, iters, t * 1e6, algbw, busbw,
                  traw * 1e6, raw_busbw, ratio, wrong_total, args.aa ? "true" : "false", args.only.c_str(),
                  tcp_cc.c_str(), args.chunk,
                  args.chunk == 0         ? "same"
                  : args.raw_chunk_buffer ? "chunk"
                                          : "unit");
            } else {
              std::printf("  %-13s %12zu %11zu %5s %5s %11.1f %8.3f %8.3f %7ld %11.1f %9.3f %6.3f\n", name.c_str(),
                          size, total, "f32", redop, t * 1e6, algbw, busbw, wrong_total, traw * 1e6, raw_busbw, ratio);
            }
            std::fflush(stdout);
          }
          sync.arrive_and_wait();
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  return 0;
}
