#include "common/process_tuning.h"

#include <malloc.h>

#include <cstdlib>
#include <cstring>

#include "gtest/gtest.h"

namespace monsoon::common {
namespace {

// Blocks glibc maps on their own (mmap) rather than take from the heap.
size_t MappedBlocks() { return mallinfo2().hblks; }

TEST(KeepFreedMemoryTest, LargeBlocksComeFromTheHeapAfterward) {
  // 24 MiB: above glibc's starting threshold (128 KiB) and below the most
  // it sets by itself (32 MiB), which it reaches only once a block that
  // large was mapped and freed: none has been in this process, so without
  // the setting this block would be mapped, and faulted in afresh each time.
  ASSERT_EQ(std::getenv("MALLOC_MMAP_THRESHOLD_"), nullptr);
  constexpr size_t kBlock = 24u << 20;
  KeepFreedMemory();
  const size_t before = MappedBlocks();
  void* block = std::malloc(kBlock);
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, kBlock);
  EXPECT_EQ(MappedBlocks(), before);
  std::free(block);
  EXPECT_EQ(MappedBlocks(), before);
}

}  // namespace
}  // namespace monsoon::common
