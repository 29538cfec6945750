#include "offload/host_step.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "zero/mixed_precision.h"
#include "zero/status.h"

namespace zero::internal {

CopyStream::Ticket RunHostStep(const ElementwiseOptimizer& opt, const HostStep& step, CopyStream& copies,
                               StagingPair& staging) {
  const ShardUpdate& whole = step.u;
  const size_t n = whole.n;
  if (n == 0) return 0;
  const size_t states = opt.StateNames().size();
  const bool copy_back = whole.param_out != nullptr;
  ZERO_CHECK(!(copy_back && step.param_host != nullptr)) << "RunHostStep: param_out and param_host both set";
  const size_t osz = copy_back ? DTypeSize(whole.param_out_dtype) : 0;
  const size_t tile = copy_back ? std::max<size_t>(step.pipeline_tile, 1) : n;  // no copy: one pass
  ZERO_CHECK(!copy_back || (staging.buffers[0].size() >= tile * osz && staging.buffers[1].size() >= tile * osz))
      << "RunHostStep: staging smaller than a pipeline tile";
  CopyStream::Ticket last = 0;
  std::vector<float*> st(states);
  for (size_t off = 0; off < n; off += tile) {
    const size_t m = std::min(tile, n - off);
    ShardUpdate t = whole.Slice(off, m, states, st.data());
    void* out = nullptr;  // where this tile's parameters are written on the host
    const int b = staging.next;
    if (copy_back) {
      copies.Wait(staging.busy[b]);  // the copy two tiles back has left this staging buffer
      out = staging.buffers[b].data();
    } else if (step.param_host != nullptr) {
      out = static_cast<char*>(step.param_host) + off * DTypeSize(whole.param_out_dtype);
    }
    t.param_out = step.stochastic ? nullptr : out;
    ParallelUpdate(opt, t, step.threads, step.optimizer_tile);
    if (step.stochastic && out != nullptr) {
      StochasticRoundToBF16(t.master, static_cast<uint16_t*>(out), m, step.stochastic_key, t.first_element);
    }
    if (copy_back) {
      char* dst = static_cast<char*>(whole.param_out) + off * osz;
      const void* src = out;
      const size_t bytes = m * osz;
      last = staging.busy[b] = step.copy_to_compute
                                   ? copies.Enqueue([f = step.copy_to_compute, dst, src, bytes] { f(dst, src, bytes); })
                                   : copies.Enqueue([dst, src, bytes] { std::memcpy(dst, src, bytes); });
      staging.next = 1 - b;
    }
  }
  return last;
}

}  // namespace zero::internal
