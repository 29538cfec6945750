// Internal: presents a zero::Store as a gloo::rendezvous::Store, so Gloo's rendezvous (connectFullMesh) can
// run over stores Gloo does not have (our TCP store). Errors become gloo::IoException, which is what Gloo's
// own stores throw and what the rendezvous code expects; gloo_communicator.cc converts them back.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "gloo/rendezvous/store.h"
#include "zero/store.h"

namespace zero::internal {

class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  // `store` must outlive the adapter.
  explicit GlooStoreAdapter(zero::Store* store) : store_(store) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, kDefaultTimeout); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  zero::Store* store_;
};

}  // namespace zero::internal
