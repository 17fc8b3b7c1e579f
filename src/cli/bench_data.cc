// `keel bench --data`: how fast the sampler serves training samples, on one core, from a
// multi-GB synthetic dataset the benchmark writes (and removes). Reports samples/s and tokens/s of
// GptDataset::GetSample (seed-keyed permutation + reads from the mmapped .bin), medians of
// repeats, beside a plain memcpy of the same bytes from the same mapping (the peer), and the
// process's anonymous memory before and after. The first repeat reads from the disk (the .bin is
// dropped from the page cache first), later ones from memory: the .bin is mapped, not loaded, so
// only the index (12 bytes per document) may grow with the dataset.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "cli/exit_code.h"
#include "core/log.h"
#include "core/rng.h"
#include "data/gpt_dataset.h"
#include "data/indexed_dataset.h"
#include "data/sample_prefetcher.h"

namespace keel::cli {
namespace {

// Anonymous resident memory (heap, stacks), kB: excludes the page cache behind the mapping.
int64_t RssAnonKb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("RssAnon:", 0) == 0) return std::atoll(line.c_str() + 8);
  return -1;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace

int BenchData(const std::string& dir_arg, double gb, int repeats, int seq_length) {
  namespace fs = std::filesystem;
  const fs::path dir =
      dir_arg.empty() ? fs::temp_directory_path() / ("keel-bench-data-" + std::to_string(getpid()))
                      : fs::path(dir_arg);
  fs::create_directories(dir);
  const std::string prefix = (dir / "synthetic").string();
  struct Cleanup {
    fs::path d;
    bool own;
    ~Cleanup() {
      std::error_code ec;
      if (own)
        fs::remove_all(d, ec);
      else {
        fs::remove(d / "synthetic.bin", ec);
        fs::remove(d / "synthetic.idx", ec);
        fs::remove(d / "synthetic.meta.json", ec);
      }
    }
  } cleanup{dir, dir_arg.empty()};

  // u16 tokens (vocab 50257), documents of 200..4000 tokens.
  const int64_t total = static_cast<int64_t>(gb * 1e9 / 2);
  const int64_t anon0 = RssAnonKb();
  auto t0 = std::chrono::steady_clock::now();
  {
    IndexedDatasetWriter w(Env::Default(), prefix, 50257);
    Status st = w.Open();
    std::vector<int32_t> doc;
    uint64_t x = 88172645463325252ull;
    for (int64_t written = 0; st.ok() && written < total;) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      const int64_t len = std::min<int64_t>(200 + static_cast<int64_t>(x % 3800), total - written);
      doc.resize(static_cast<size_t>(len));
      for (auto& t : doc) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        t = static_cast<int32_t>(x % 50257);
      }
      st = w.AddDocument(doc);
      written += len;
    }
    if (st.ok()) st = w.Finish({"gpt2", "", 50257, 50256});
    if (!st.ok()) {
      LogError("error: writing the synthetic dataset: " + st.message());
      return 1;
    }
  }
  const double write_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::unique_ptr<IndexedDataset> data;
  Status st = IndexedDataset::Open(Env::Default(), prefix, &data);
  std::unique_ptr<GptDataset> ds;
  if (st.ok()) st = GptDataset::Create(data.get(), "1,0,0", Split::kTrain, seq_length, 1234, &ds);
  if (!st.ok()) return Fail(st);
  const int64_t anon_open = RssAnonKb();
  Log("data bench: {} ({:.2f} GB, {} documents, {} tokens, written in {:.1f} s); samples of {} "
      "tokens; one thread",
      prefix, gb, data->NumDocuments(), data->NumTokens(), write_s, seq_length + 1);
  std::vector<int32_t> buf(static_cast<size_t>(seq_length) + 1);
  std::vector<char> raw(static_cast<size_t>(seq_length + 1) * 2);
  const int64_t n = ds->SamplesPerEpoch();
  std::vector<double> sampler, peer;
  int64_t index = 0;
  uint64_t checksum = 0;
  for (int rep = 0; rep < repeats; ++rep) {
    // Drop the .bin from the page cache (written back first): the first repeat reads from the
    // disk. Pages this process has mapped and touched stay resident, so later repeats measure the
    // sampler itself on cached data.
    if (int fd = ::open((prefix + ".bin").c_str(), O_RDONLY); fd >= 0) {
      ::fdatasync(fd);
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    }
    // The sampler, in training order (a permutation of the whole dataset: pages from all over).
    int64_t k = 0;
    auto s0 = std::chrono::steady_clock::now();
    double el = 0;
    while (el < 1.0) {
      for (int i = 0; i < 256; ++i, ++k) {
        ds->GetSample(index++, buf.data());
        checksum += static_cast<uint64_t>(buf[0]);
      }
      el = std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
    }
    sampler.push_back(static_cast<double>(k) * seq_length / el);
    // The peer: the same number of bytes copied from random offsets of the same mapping.
    const RngKey key{99, RngPurpose::kTest, static_cast<uint64_t>(rep)};
    int64_t m = 0;
    s0 = std::chrono::steady_clock::now();
    el = 0;
    while (el < 1.0) {
      for (int i = 0; i < 256; ++i, ++m) {
        const int64_t at =
            static_cast<int64_t>(U64At(key, m) % static_cast<uint64_t>(n)) * seq_length;
        data->ReadStream(at, seq_length + 1, buf.data());
        checksum += static_cast<uint64_t>(buf[1]);
      }
      el = std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
    }
    peer.push_back(static_cast<double>(m) * seq_length / el);
    Log("  repeat {}: sampler {:.1f} M tokens/s ({:.0f} samples/s); unpermuted reads {:.1f} M "
        "tokens/s",
        rep + 1, sampler.back() / 1e6, sampler.back() / seq_length, peer.back() / 1e6);
  }
  // The loop's view: iterations of 32 samples, each followed by an emulated 10 ms step (the
  // accelerator busy, this thread asleep). What counts is how long the loop waits for its batch:
  // reading in the loop (direct) against reading ahead on the prefetch thread. Both start cold.
  const int batch = 32, step_ms = 10, iters = 60;
  std::vector<double> waits[2];
  for (int mode = 0; mode < 2; ++mode) {
    if (int fd = ::open((prefix + ".bin").c_str(), O_RDONLY); fd >= 0) {
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    }
    SamplePrefetcher prefetcher(
        [&ds](int64_t k, uint64_t, int32_t* t) {
          ds->GetSample(k, t);
          return SampleOrigin{0, ds->EpochOf(k)};
        },
        seq_length + 1, 2 * batch);
    const int64_t first = index + (mode + 1) * 1000003;  // fresh positions for each mode
    for (int it = 0; it < iters; ++it) {
      const auto w0 = std::chrono::steady_clock::now();
      for (int b = 0; b < batch; ++b) {
        const int64_t k = first + static_cast<int64_t>(it) * batch + b;
        if (mode == 0)
          ds->GetSample(k, buf.data());
        else
          prefetcher.Get(k, 0, buf.data());
        checksum += static_cast<uint64_t>(buf[2]);
      }
      waits[mode].push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - w0).count());
      std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
    }
  }
  auto tail = [](std::vector<double> v) {
    const double first_wait = v.front();
    std::sort(v.begin(), v.end());
    return fmt::format("median {:.3f} ms, p95 {:.3f} ms, max {:.3f} ms (first {:.3f} ms)",
                       Median(v), v[v.size() * 95 / 100], v.back(), first_wait);
  };
  Log("loop wait for a batch of {} samples before each emulated {} ms step, from a cold cache, "
      "{} iterations:",
      batch, step_ms, iters);
  Log("  read in the loop:       {}", tail(waits[0]));
  Log("  prefetch thread:        {}", tail(waits[1]));
  Log("  median wait, prefetch / direct: {:.3f}",
      Median(waits[1]) / std::max(1e-9, Median(waits[0])));
  const int64_t anon_end = RssAnonKb();
  Log("median: sampler {:.1f} M tokens/s ({:.0f} samples/s), {:.2f} of random-offset reads "
      "without the permutation ({:.1f} M tokens/s); target >= 10 M tokens/s on one core",
      Median(sampler) / 1e6, Median(sampler) / seq_length, Median(sampler) / Median(peer),
      Median(peer) / 1e6);
  Log("anonymous memory: {} kB before writing, {} kB after opening ({} documents: the index is "
      "{} kB), {} kB after sampling; the .bin is mapped, never copied (checksum {})",
      anon0, anon_open, data->NumDocuments(), data->NumDocuments() * 20 / 1024, anon_end, checksum);
  return 0;
}

}  // namespace keel::cli
