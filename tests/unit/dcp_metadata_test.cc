// The DCP .metadata reader on a file torch 2.11 wrote
// (data/make_dcp_small.py), and pickles that must be refused; the writers
// (WriteDcpMetadata, TorchSaveFloatTensor) read back by the readers. That
// Python reads what they write is tests/oracle/dcp_oracle.py's part.
#include "common/checkpoint/dcp_metadata.h"

#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#include "common/checkpoint/pickle_reader.h"
#include "common/checkpoint/torch_saved_tensor.h"

namespace shardline {
namespace {

std::string DataFile(const std::string& name) {
  std::ifstream in(std::string(SHARDLINE_TEST_DATA) + "/" + name, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string SmallMetadata() { return DataFile("dcp_small.metadata"); }

// Python's pickler memoizes shared objects: 41 KB (data/make_dcp_memoized.py)
// name 200,000 chunks, 16 MB of sizes once expanded, which a 1 GiB budget
// let through (a 28 MB file cost 1.4 GB and 6 s). Refused by the budget a
// real file's size allows, naming it.
TEST(DcpMetadata, MemoizedReferencesRepeatedPastTheFilesSizeAreRefused) {
  const std::string data = DataFile("dcp_memoized.metadata");
  ASSERT_GT(data.size(), 30000u);
  absl::StatusOr<DcpMetadata> m = ParseDcpMetadata(data, "ckpt/.metadata");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("ckpt/.metadata: more than"), std::string::npos) << m.status();
  EXPECT_NE(m.status().message().find("bytes of names and sizes (8 for each byte of the file"), std::string::npos)
      << m.status();
}

TEST(DcpMetadata, ReadsWhatTorchWrote) {
  const std::string data = SmallMetadata();
  ASSERT_GT(data.size(), 1000u);
  absl::StatusOr<DcpMetadata> m = ParseDcpMetadata(data, "ck/.metadata");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->version, "1.0.0");
  ASSERT_EQ(m->tensors.size(), 16u);  // 4 parameters, and step, exp_avg, exp_avg_sq of each
  const DcpTensorMeta& w = m->tensors.at("model.0.weight");
  EXPECT_EQ(w.dtype, "float32");
  EXPECT_EQ(w.size, (std::vector<int64_t>{3, 4}));
  ASSERT_EQ(w.chunks.size(), 1u);
  EXPECT_EQ(w.chunks[0].offsets, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(w.chunks[0].sizes, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(m->tensors.at("optim.state.1.bias.exp_avg_sq").size, (std::vector<int64_t>{2}));
  EXPECT_TRUE(m->tensors.at("optim.state.0.weight.step").size.empty());  // AdamW's step: a 0-dim tensor
  EXPECT_NE(std::find(m->values.begin(), m->values.end(), "step"), m->values.end());
  EXPECT_NE(std::find(m->values.begin(), m->values.end(), "optim.param_groups.0.lr"), m->values.end());
  // Every entry has its bytes somewhere, each tensor chunk by its offsets.
  EXPECT_EQ(m->storage.size(), m->tensors.size() + m->values.size());
  for (const DcpStorage& s : m->storage) {
    EXPECT_EQ(s.relative_path, "__0_0.distcp");
    EXPECT_GT(s.length, 0);
    auto t = m->tensors.find(s.fqn);
    if (t != m->tensors.end()) {
      EXPECT_EQ(s.chunk_offsets.size(), t->second.size.size()) << s.fqn;  // (0 for a 0-dim "step")
    } else {
      EXPECT_NE(std::find(m->values.begin(), m->values.end(), s.fqn), m->values.end()) << s.fqn;
      EXPECT_TRUE(s.chunk_offsets.empty()) << s.fqn;
    }
  }
}

TEST(DcpMetadata, AForeignGlobalIsRefusedByName) {
  // pickle.dumps(os.system) at protocol 4: importing it is all a loader needs to run code.
  const std::string evil = "\x80\x04\x8c\x02os\x8c\x06system\x93.";
  absl::StatusOr<DcpMetadata> m = ParseDcpMetadata(evil, "ck/.metadata");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("refused global os.system"), std::string::npos) << m.status();
  // The text protocol's GLOBAL likewise.
  m = ParseDcpMetadata("cbuiltins\neval\n(S'1'\ntR.", "ck/.metadata");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("refused global builtins.eval"), std::string::npos) << m.status();
}

TEST(DcpMetadata, OpcodesOutsideTheSubsetAndTruncationAreRefused) {
  const std::string data = SmallMetadata();
  for (size_t cut : {size_t{0}, size_t{1}, size_t{11}, data.size() / 2, data.size() - 1}) {
    absl::StatusOr<DcpMetadata> m = ParseDcpMetadata(data.substr(0, cut), "ck/.metadata");
    ASSERT_FALSE(m.ok()) << cut;
    EXPECT_EQ(m.status().message().rfind("ck/.metadata: ", 0), 0u) << m.status();
  }
  // BINPERSID: a persistent id asks the loader to fetch an outside object.
  absl::StatusOr<DcpMetadata> m = ParseDcpMetadata("\x80\x02K\x01Q.", "ck/.metadata");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("opcode 0x51 is not in the subset"), std::string::npos) << m.status();
}

TEST(DcpMetadata, AStorageFileOutsideTheDirectoryIsRefused) {
  std::string data = SmallMetadata();
  const size_t at = data.find("__0_0.distcp");
  ASSERT_NE(at, std::string::npos);
  data.replace(at, 12, "../0_0.distc");  // same length: the pickle stays well formed
  absl::StatusOr<DcpMetadata> m = ParseDcpMetadata(data, "ck/.metadata");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("../0_0.distc is not a file name in the checkpoint directory"),
            std::string::npos)
      << m.status();
}

TEST(PickleReader, BuildsPlainDataAndSharesMemoizedValues) {
  // pickle.dumps({"a": L, "b": "\u00e9", "c": L}, protocol=2) with L = [1, -2, 70000, 1.5, None, True]:
  // "c" is a memo reference (BINGET) to the list "a" built.
  static const char kPickle[] =
      "\x80\x02}q\x00(X\x01\x00\x00\x00" "aq\x01]q\x02(K\x01J\xfe\xff\xff\xffJp\x11\x01\x00G?\xf8\x00\x00\x00\x00\x00\x00N\x88" "eX\x01\x00\x00\x00" "bq\x03X\x02\x00\x00\x00\xc3\xa9q\x04X\x01\x00\x00\x00" "cq\x05h\x02u.";
  const std::string p(kPickle, sizeof(kPickle) - 1);
  PickleReader reader({});
  absl::StatusOr<const PickleValue*> v = reader.Read(p, "p");
  ASSERT_TRUE(v.ok()) << v.status();
  const PickleValue* a = (*v)->Get("a");
  ASSERT_TRUE(a && a->Is(PickleValue::Kind::kList));
  ASSERT_EQ(a->items.size(), 6u);
  EXPECT_EQ(a->items[0]->i, 1);
  EXPECT_EQ(a->items[1]->i, -2);
  EXPECT_EQ(a->items[2]->i, 70000);
  EXPECT_EQ(a->items[3]->f, 1.5);
  EXPECT_TRUE(a->items[4]->Is(PickleValue::Kind::kNone));
  EXPECT_TRUE(a->items[5]->b);
  EXPECT_EQ((*v)->Get("b")->s, "\xc3\xa9");
  EXPECT_EQ((*v)->Get("c"), a);
}

TEST(DcpMetadata, WhatIsWrittenReadsBack) {
  DcpMetadata m;
  m.tensors["model.w"] = {"float32", {4, 3}, {{{0, 0}, {3, 3}}, {{3, 0}, {1, 3}}}};
  m.tensors["optim.state.w.step"] = {"float32", {}, {{{}, {}}}};
  m.values = {"optim.param_groups.0.lr"};
  m.storage = {{"model.w", {0, 0}, "__0_0.distcp", 0, 100},
               {"model.w", {3, 0}, "__0_0.distcp", 100, 90},
               {"optim.state.w.step", {}, "__0_0.distcp", 190, 80},
               {"optim.param_groups.0.lr", {}, "__0_0.distcp", 270, 70000}};
  m.planner_data["model.w"] = {{"model", -1}, {"w", -1}};
  m.planner_data["optim.param_groups.0.lr"] = {{"optim", -1}, {"param_groups", -1}, {"", 0}, {"lr", -1}};
  absl::StatusOr<DcpMetadata> back = ParseDcpMetadata(WriteDcpMetadata(m), "out/.metadata");
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->tensors.size(), 2u);
  const DcpTensorMeta& w = back->tensors.at("model.w");
  EXPECT_EQ(w.size, (std::vector<int64_t>{4, 3}));
  ASSERT_EQ(w.chunks.size(), 2u);
  EXPECT_EQ(w.chunks[1].offsets, (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(w.chunks[1].sizes, (std::vector<int64_t>{1, 3}));
  EXPECT_TRUE(back->tensors.at("optim.state.w.step").size.empty());
  EXPECT_EQ(back->values, m.values);
  ASSERT_EQ(back->storage.size(), 4u);
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(back->storage[k].fqn, m.storage[k].fqn);
    EXPECT_EQ(back->storage[k].chunk_offsets, m.storage[k].chunk_offsets);
    EXPECT_EQ(back->storage[k].offset, m.storage[k].offset);
    EXPECT_EQ(back->storage[k].length, m.storage[k].length);
  }
  EXPECT_EQ(back->version, "1.0.0");
}

// An archive in a file at an offset, as a .distcp holds it.
int FileWith(const std::string& bytes) {
  const int fd = memfd_create("distcp", 0);
  EXPECT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  return fd;
}

TEST(TorchSavedTensor, WhatIsWrittenReadsBackAtAnOffset) {
  const float values[6] = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f};
  const std::string archive = TorchSaveFloatTensor({2, 3}, values).value();
  const std::string before(1000, 'x');
  const int fd = FileWith(before + archive + "tail");
  absl::StatusOr<TorchSavedTensor> t = ReadTorchSavedTensor(fd, "a.distcp", 1000, archive.size());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->dtype, "float32");
  EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t->data_offset % 64, 1000 % 64);  // 64-byte aligned within the archive
  float got[4];
  ASSERT_TRUE(ReadTorchSavedFloats(fd, "a.distcp", *t, 2, 4, got).ok());
  EXPECT_EQ(std::vector<float>(got, got + 4), std::vector<float>(values + 2, values + 6));
  EXPECT_FALSE(ReadTorchSavedFloats(fd, "a.distcp", *t, 3, 4, got).ok());  // past its 6 elements

  const float step = 5.0f;
  const std::string scalar = TorchSaveFloatTensor({}, &step).value();
  const int fd2 = FileWith(scalar);
  t = ReadTorchSavedTensor(fd2, "s.distcp", 0, scalar.size());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->shape.empty());
  EXPECT_EQ(t->numel, 1);
  // Any range other than the archive's: refused, naming the file.
  absl::StatusOr<TorchSavedTensor> cut = ReadTorchSavedTensor(fd, "a.distcp", 1000, archive.size() - 30);
  ASSERT_FALSE(cut.ok());
  EXPECT_EQ(cut.status().message().rfind("a.distcp", 0), 0u) << cut.status();
  // A range past the file's end: refused before any offset is computed from it.
  cut = ReadTorchSavedTensor(fd, "a.distcp", 1000, int64_t{1} << 62);
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("run past its end"), std::string::npos) << cut.status();
  close(fd);
  close(fd2);
}

}  // namespace
}  // namespace shardline
