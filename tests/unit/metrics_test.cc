// Our additions to prometheus-cpp (Clear, collect hooks, histogram buckets),
// the process collector, and the HTTP server over a real loopback socket:
// /metrics, /sd/workers, bearer tokens, 404, a taken port, idle and slow
// clients that must not hold a scrape up.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <poll.h>

#include <chrono>
#include <ctime>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/base/build_info.h"
#include "common/metrics/metrics.h"
#include "common/metrics/metrics_http.h"
#include "common/metrics/metrics_process.h"

namespace shardline::metrics {
namespace {

TEST(Metrics, TextFormatWithLabels) {
  Registry r;
  auto& c = r.AddCounter("shardline_tokens_total", "Tokens processed.");
  c.Add({{"job_id", "j-1"}, {"rank", "0"}}).Increment(5);
  c.Add({{"job_id", "j-1"}, {"rank", "0"}}).Increment(2.5);
  c.Add({{"job_id", "j-1"}, {"rank", "0"}}).Increment(-1);  // ignored
  auto& g = r.AddGauge("shardline_loss", "Loss");
  g.Add({{"job_id", "a\"b"}}).Set(0.25);
  const std::string page = r.Serialize();
  EXPECT_NE(page.find("# HELP shardline_tokens_total Tokens processed.\n"
                      "# TYPE shardline_tokens_total counter\n"
                      "shardline_tokens_total{job_id=\"j-1\",rank=\"0\"} 7.5"),
            std::string::npos)
      << page;
  EXPECT_NE(page.find("# TYPE shardline_loss gauge\nshardline_loss{job_id=\"a\\\"b\"} 0.25"), std::string::npos)
      << page;
}

TEST(Metrics, HistogramKeepsItsBuckets) {
  Registry r;
  auto& h = r.AddHistogram("shardline_step_duration_seconds", "Step time", {0.5, 1, 2});
  Histogram& s = h.Add({{"rank", "1"}});
  for (double v : {0.1, 0.5, 0.75, 2.0, 9.0}) s.Observe(v);
  EXPECT_EQ(&h.Add({{"rank", "1"}}), &s);
  const std::string page = r.Serialize();
  for (const char* line : {"shardline_step_duration_seconds_bucket{rank=\"1\",le=\"0.5\"} 2",
                           "shardline_step_duration_seconds_bucket{rank=\"1\",le=\"1\"} 3",
                           "shardline_step_duration_seconds_bucket{rank=\"1\",le=\"2\"} 4",
                           "shardline_step_duration_seconds_bucket{rank=\"1\",le=\"+Inf\"} 5",
                           "shardline_step_duration_seconds_count{rank=\"1\"} 5"}) {
    EXPECT_NE(page.find(line), std::string::npos) << line << "\n" << page;
  }
}

TEST(Metrics, RemoveAndClearDropSeriesAndCollectorsRunFirst) {
  Registry r;
  auto& g = r.AddGauge("shardline_queue_length", "Queued jobs");
  int runs = 0;
  r.AddCollector([&] { g.Add({}).Set(++runs); });
  EXPECT_NE(r.Serialize().find("shardline_queue_length 1"), std::string::npos);
  EXPECT_NE(r.Serialize().find("shardline_queue_length 2"), std::string::npos);
  g.Add({{"job_id", "x"}}).Set(3);
  g.Remove({{"job_id", "x"}});
  EXPECT_EQ(r.Serialize().find("job_id=\"x\""), std::string::npos);
  auto& c = r.AddCounter("shardline_x_total", "x");
  c.Add({{"a", "1"}}).Increment();
  c.Clear();
  EXPECT_EQ(r.Serialize().find("shardline_x_total{"), std::string::npos);
  c.Add({{"a", "1"}}).Increment();  // a cleared series starts again from zero
  EXPECT_NE(r.Serialize().find("shardline_x_total{a=\"1\"} 1"), std::string::npos);
}

TEST(Metrics, ExponentialBuckets) {
  EXPECT_EQ(ExponentialBuckets(0.001, 10, 3), (std::vector<double>{0.001, 0.01, 0.1}));
}

TEST(Metrics, ProcessCollectorHasBuildInfoAndProcessMetrics) {
  const std::string page = Serialize(ProcessCollector().Collect());
  EXPECT_NE(page.find(std::string("shardline_build_info{revision=\"") + kRevision + "\",version=\"" + kVersion +
                      "\"} 1"),
            std::string::npos)
      << page;
  for (const char* name : {"process_cpu_seconds_total", "process_resident_memory_bytes",
                           "process_virtual_memory_bytes", "process_open_fds", "process_max_fds",
                           "process_start_time_seconds"}) {
    EXPECT_NE(page.find(std::string("\n") + name + " "), std::string::npos) << name << "\n" << page;
  }
  const double start = std::stod(page.substr(page.find("\nprocess_start_time_seconds ") + 28));
  EXPECT_NEAR(start, static_cast<double>(time(nullptr)), 3600) << page;
}

// A TCP connection to 127.0.0.1:port from `source` (another loopback
// address stands for another client host), or -1.
int ConnectFrom(const char* source, int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  inet_pton(AF_INET, source, &from.sin_addr);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string HttpGet(int port, const std::string& path, const std::string& headers = "") {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  // Every read has a deadline: a server that does not answer fails the test.
  const timeval five_seconds{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &five_seconds, sizeof(five_seconds));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return "connect failed";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: x\r\n" + headers + "\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string resp;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) resp.append(buf, n);
  close(fd);
  return resp;
}

TEST(MetricsServer, ServesMetricsAndJsonOverHttp) {
  auto r = std::make_shared<Registry>();
  r->AddGauge("shardline_up", "1").Add({}).Set(1);
  auto server = MetricsServer::Start("127.0.0.1:0", {r}, {{"/sd/workers", [] { return std::string("[]"); }}});
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);
  std::string m = HttpGet(port, "/metrics");
  EXPECT_NE(m.find("200 OK"), std::string::npos) << m;
  EXPECT_NE(m.find("Content-Type: text/plain"), std::string::npos) << m;  // prometheus-cpp: no version=
  EXPECT_NE(m.find("# HELP shardline_up 1\n# TYPE shardline_up gauge\nshardline_up 1"), std::string::npos) << m;
  EXPECT_NE(m.find("\nshardline_build_info{"), std::string::npos) << m;
  EXPECT_NE(m.find("\nprocess_open_fds "), std::string::npos) << m;
  std::string sd = HttpGet(port, "/sd/workers");
  EXPECT_NE(sd.find("application/json"), std::string::npos) << sd;
  EXPECT_EQ(sd.substr(sd.size() - 2), "[]");
  EXPECT_NE(HttpGet(port, "/metricsx").find("404"), std::string::npos);
  EXPECT_NE(HttpGet(port, "/sd/workersx").find("404"), std::string::npos);

  // The port is taken now: a second server on it fails with a named address.
  auto clash = MetricsServer::Start("127.0.0.1:" + std::to_string(port), {r});
  ASSERT_FALSE(clash.ok());
  EXPECT_NE(clash.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos);
  // The failed start left the first server serving.
  EXPECT_NE(HttpGet(port, "/metrics").find("200 OK"), std::string::npos);
}

TEST(MetricsServer, BearerTokensGuardEveryPath) {
  auto r = std::make_shared<Registry>();
  r->AddGauge("shardline_up", "1").Add({}).Set(1);
  auto server = MetricsServer::Start("127.0.0.1:0", {r}, {{"/sd/workers", [] { return std::string("[]"); }}},
                                     {"s3cret"});
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  for (const char* path : {"/metrics", "/sd/workers"}) {
    EXPECT_NE(HttpGet(port, path).find("401"), std::string::npos) << path;
    EXPECT_NE(HttpGet(port, path, "Authorization: Bearer wrong\r\n").find("401"), std::string::npos) << path;
    EXPECT_NE(HttpGet(port, path, "Authorization: Basic czNjcmV0\r\n").find("401"), std::string::npos) << path;
    EXPECT_NE(HttpGet(port, path, "Authorization: Bearer s3cret\r\n").find("200 OK"), std::string::npos) << path;
  }
  (*server)->SetBearerTokens({"new"});
  EXPECT_NE(HttpGet(port, "/metrics", "Authorization: Bearer s3cret\r\n").find("401"), std::string::npos);
  EXPECT_NE(HttpGet(port, "/metrics", "Authorization: Bearer new\r\n").find("200 OK"), std::string::npos);
}

// A server with a thread per connection (civetweb's two) answered nothing
// for 10 s behind two clients sending half a header, and for minutes
// behind a few hundred that sent nothing.
TEST(MetricsServer, IdleAndSlowClientsDoNotHoldAScrapeUp) {
  auto r = std::make_shared<Registry>();
  r->AddGauge("shardline_up", "1").Add({}).Set(1);
  auto server = MetricsServer::Start("127.0.0.1:0", {r});
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  std::vector<int> idle, slow;
  for (int i = 0; i < 200; ++i) {
    const int fd = ConnectFrom("127.0.0.2", port);
    ASSERT_GE(fd, 0) << i;
    idle.push_back(fd);
  }
  for (const char* source : {"127.0.0.3", "127.0.0.4"}) {
    const int fd = ConnectFrom(source, port);
    ASSERT_GE(fd, 0);
    const std::string half = "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    ASSERT_EQ(write(fd, half.data(), half.size()), static_cast<ssize_t>(half.size()));
    slow.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let the server take them all in
  const std::string m = HttpGet(port, "/metrics");
  EXPECT_NE(m.find("200 OK"), std::string::npos) << m;
  EXPECT_NE(m.find("shardline_up 1"), std::string::npos) << m;

  // One address holds at most 8 connections: the server closes the others
  // (a read sees their end), so a flood from one host cannot take every
  // descriptor the server may open.
  std::vector<bool> ended(idle.size(), false);
  int closed = 0;
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
       closed < 200 - 8 && std::chrono::steady_clock::now() < until;) {
    for (size_t i = 0; i < idle.size(); ++i) {
      pollfd p{idle[i], POLLIN, 0};
      char c;
      if (!ended[i] && poll(&p, 1, 0) == 1 && read(idle[i], &c, 1) == 0) ended[i] = true, ++closed;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(closed, 200 - 8);
  for (int fd : idle) close(fd);
  for (int fd : slow) close(fd);
}

TEST(MetricsServer, ListenAddressFromFlags) {
  EXPECT_EQ(MetricsListenAddress("127.0.0.1:9", 9400), "127.0.0.1:9");
  EXPECT_EQ(MetricsListenAddress("", 9400), "0.0.0.0:9400");
  EXPECT_EQ(MetricsListenAddress("", 0), "0.0.0.0:0");
  EXPECT_EQ(MetricsListenAddress("", -1), "");
}

}  // namespace
}  // namespace shardline::metrics
