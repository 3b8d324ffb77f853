// The one admission verb of ABI 1.10 (hs_admit_args, hs_admit2, hs_admit_batch2) against the real
// daemon, through the C ABI: contradictory options refused before any RPC with the fields named;
// struct sizes and array strides of older and newer callers; options together that no older call
// could ask (a shared prefix that is durable; a batch mixing durable and plain items); and a
// single hs_admit whose slab mapping fails here releasing the request in the daemon, as a
// batch's does (issue 41, item 3).
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "test_support.h"

namespace hisparse::testing {
namespace admit2_test {

hs_admit_args Args(uint64_t id, uint32_t budget) {
  hs_admit_args a = HS_ADMIT_ARGS_INIT;
  a.request_id = id;
  a.token_budget = budget;
  return a;
}

class Admit2Test : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = StartDaemon();
    ASSERT_NE(daemon_, nullptr);
    address_ = daemon_->address();
    ASSERT_TRUE(Session::Open(SmallGeometry(address_), &s_).ok()) << hs_last_error();
  }
  uint32_t DaemonRequests() { return Stats(address_).requests(); }

  std::unique_ptr<DaemonProcess> daemon_;
  std::string address_;
  Session s_;
};

TEST_F(Admit2Test, ContradictoryOptionsAreRefusedNamingTheFields) {
  const hs_admit_args parent = Args(1, 100);
  ASSERT_EQ(hs_admit2(s_.get(), &parent, nullptr), HS_OK) << hs_last_error();
  struct Case {
    const char* what;
    hs_admit_args args;
    std::vector<std::string> named;  // what hs_last_error() must name
  };
  std::vector<Case> cases;
  auto add = [&](const char* what, auto&& edit, std::vector<std::string> named) {
    Case c{what, Args(2, 100), std::move(named)};
    edit(c.args);
    cases.push_back(std::move(c));
  };
  add("parent without prefix", [](hs_admit_args& a) { a.parent_request_id = 1; },
      {"parent_request_id", "prefix_tokens"});
  add("prefix without parent", [](hs_admit_args& a) { a.prefix_tokens = 8; }, {"prefix_tokens", "parent_request_id"});
  add("group with parent",
      [](hs_admit_args& a) {
        a.flags = HS_ADMIT_GROUP;
        a.parent_request_id = 1;
        a.prefix_tokens = 8;
      },
      {"HS_ADMIT_GROUP", "parent_request_id"});
  add("group with lease",
      [](hs_admit_args& a) {
        a.flags = HS_ADMIT_GROUP;
        a.lease_seconds = 60;
      },
      {"HS_ADMIT_GROUP", "lease_seconds"});
  add("group with import", [](hs_admit_args& a) { a.flags = HS_ADMIT_GROUP | HS_ADMIT_IMPORT; },
      {"HS_ADMIT_GROUP", "HS_ADMIT_IMPORT"});
  add("import with parent",
      [](hs_admit_args& a) {
        a.flags = HS_ADMIT_IMPORT;
        a.parent_request_id = 1;
        a.prefix_tokens = 8;
      },
      {"HS_ADMIT_IMPORT", "parent_request_id"});
  add("import with lease",
      [](hs_admit_args& a) {
        a.flags = HS_ADMIT_IMPORT;
        a.lease_seconds = 60;
      },
      {"HS_ADMIT_IMPORT", "lease_seconds"});
  add("unknown flags", [](hs_admit_args& a) { a.flags = 0x80; }, {"flags", "unknown"});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    hs_request_info info = HS_REQUEST_INFO_INIT;
    info.row = 12345;
    EXPECT_EQ(hs_admit2(s_.get(), &c.args, &info), HS_ERR_INVALID_ARGUMENT);
    const std::string message = hs_last_error();
    for (const std::string& name : c.named) EXPECT_NE(message.find(name), std::string::npos) << message;
    EXPECT_EQ(info.row, 12345u) << "out is written only on success";
  }
  EXPECT_EQ(DaemonRequests(), 1u) << "a refused admission reaches nothing";
  // In a batch: the item is named, and nothing of the batch is admitted.
  std::vector<hs_admit_args> items = {Args(3, 100), cases[0].args};
  std::vector<hs_result> results(2, HS_ERR_UNIMPLEMENTED);
  EXPECT_EQ(hs_admit_batch2(s_.get(), 2, items.data(), HS_BATCH_PER_ITEM, results.data(), nullptr),
            HS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hs_last_error()).find("items[1]"), std::string::npos) << hs_last_error();
  EXPECT_EQ(results[0], HS_ERR_UNIMPLEMENTED) << "an error of the whole call leaves out_results untouched";
  EXPECT_EQ(DaemonRequests(), 1u);
}

TEST_F(Admit2Test, StructSizesAndStridesOfOlderAndNewerCallers) {
  hs_admit_args small = Args(1, 100);
  small.struct_size = sizeof(hs_admit_args) - 4;
  EXPECT_EQ(hs_admit2(s_.get(), &small, nullptr), HS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hs_last_error()).find("struct_size"), std::string::npos) << hs_last_error();
  EXPECT_EQ(hs_admit2(s_.get(), nullptr, nullptr), HS_ERR_INVALID_ARGUMENT);

  // A caller built against a later minor: larger structs, whose tails this library neither reads
  // nor writes.
  struct NewerArgs {
    hs_admit_args args;
    uint64_t future;
  };
  struct NewerInfo {
    hs_request_info info;
    uint32_t future;
  };
  std::vector<NewerArgs> items(3);
  std::vector<NewerInfo> infos(3);
  for (int i = 0; i < 3; ++i) {
    items[i].args = Args(10 + i, 100 * (i + 1));
    items[i].args.struct_size = sizeof(NewerArgs);
    items[i].future = ~0ull;
    infos[i].info = HS_REQUEST_INFO_INIT;
    infos[i].info.struct_size = sizeof(NewerInfo);
    infos[i].future = 0xabcdef;
  }
  std::vector<hs_result> results(3, HS_ERR_UNIMPLEMENTED);
  ASSERT_EQ(hs_admit_batch2(s_.get(), 3, &items[0].args, HS_BATCH_ALL_OR_NOTHING, results.data(), &infos[0].info),
            HS_OK)
      << hs_last_error();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(results[i], HS_OK);
    EXPECT_GE(infos[i].info.capacity_tokens, 100u * (i + 1)) << i;
    EXPECT_EQ(infos[i].info.struct_size, sizeof(NewerInfo));
    EXPECT_EQ(infos[i].future, 0xabcdefu) << "written past the library's hs_request_info";
    void* rec = nullptr;
    EXPECT_EQ(hs_record_ptr(s_.get(), 10 + i, 3, 100 * (i + 1) - 1, &rec), HS_OK) << hs_last_error();
  }
  // Items of different sizes cannot be walked: refused, naming the item.
  items[1].args.struct_size = sizeof(hs_admit_args);
  EXPECT_EQ(hs_admit_batch2(s_.get(), 2, &items[0].args, HS_BATCH_PER_ITEM, results.data(), nullptr),
            HS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hs_last_error()).find("items[1].struct_size"), std::string::npos) << hs_last_error();
  EXPECT_EQ(DaemonRequests(), 3u);
}

// A shared prefix that is durable from admission: no older call could ask both at once.
TEST_F(Admit2Test, ASharedPrefixMayBeDurable) {
  ASSERT_EQ(hs_admit(s_.get(), 1, 0, 300, nullptr), HS_OK) << hs_last_error();
  hs_admit_args child = Args(2, 400);
  child.parent_request_id = 1;
  child.prefix_tokens = 256;
  child.lease_seconds = 60;
  hs_request_info info = HS_REQUEST_INFO_INIT;
  ASSERT_EQ(hs_admit2(s_.get(), &child, &info), HS_OK) << hs_last_error();
  EXPECT_GE(info.capacity_tokens, 400u);
  v1::StatsResponse st = Stats(address_);
  EXPECT_EQ(st.requests(), 2u);
  EXPECT_EQ(st.durable_requests(), 1u);
  // And a batch mixing a durable item with a plain one.
  std::vector<hs_admit_args> items = {Args(3, 100), Args(4, 100)};
  items[1].lease_seconds = 60;
  std::vector<hs_result> results(2, HS_ERR_UNIMPLEMENTED);
  ASSERT_EQ(hs_admit_batch2(s_.get(), 2, items.data(), HS_BATCH_ALL_OR_NOTHING, results.data(), nullptr), HS_OK)
      << hs_last_error();
  EXPECT_EQ(Stats(address_).durable_requests(), 2u);
}

// The single path releases what it cannot install, as the batch path does
// (BatchAdmissionTest.MappingFailureAfterTheDaemonAdmittedReleasesTheBatch): no descriptor left,
// the fd channel cannot hand the new slab over after the daemon admitted.
TEST_F(Admit2Test, ASingleAdmitWhoseMappingFailsIsReleasedInTheDaemon) {
  struct rlimit saved;
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  const int lowest_free = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(lowest_free, 0);
  ::close(lowest_free);
  struct rlimit tight = saved;
  tight.rlim_cur = static_cast<rlim_t>(lowest_free);  // every number below it is taken: no new fd
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &tight), 0);
  const hs_result r = hs_admit(s_.get(), 1, 0, 100, nullptr);
  const std::string message = hs_last_error();
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);

  EXPECT_NE(r, HS_OK);
  EXPECT_NE(message.find("fd channel"), std::string::npos) << message;
  void* rec = nullptr;
  EXPECT_EQ(hs_record_ptr(s_.get(), 1, 0, 0, &rec), HS_ERR_NOT_FOUND) << "nothing kept here";
  v1::StatsResponse st = Stats(address_);
  EXPECT_EQ(st.requests(), 0u) << "the daemon still holds the request this process could not install";
  EXPECT_EQ(st.host_pool().pages_used(), 0u);
  ASSERT_EQ(hs_admit(s_.get(), 1, 0, 100, nullptr), HS_OK) << hs_last_error();
  EXPECT_EQ(DaemonRequests(), 1u);
}

}  // namespace admit2_test
}  // namespace hisparse::testing
