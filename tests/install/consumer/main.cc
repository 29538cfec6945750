#include <cstdio>

#include "zero/zero.h"

int main() {
  uint16_t h = zero::F32ToBF16(1.5f);
  std::printf("zero consumer: bf16(1.5) = 0x%04x, back = %g\n", h, zero::BF16ToF32(h));
  return zero::BF16ToF32(h) == 1.5f ? 0 : 1;
}
