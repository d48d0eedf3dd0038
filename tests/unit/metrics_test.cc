// The exposition format byte for byte, histogram bucket edges, and the HTTP
// server over a real loopback socket.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "common/metrics.h"
#include "common/metrics_http.h"

namespace shardline::metrics {
namespace {

TEST(Metrics, TextFormatWithLabelsAndEscapes) {
  Registry r;
  auto& c = r.AddCounter("shardline_tokens_total", "Tokens processed.\nSecond line");
  c.Add({{"job", "j-1"}, {"rank", "0"}}).Increment(5);
  c.Add({{"job", "j-1"}, {"rank", "0"}}).Increment(2.5);
  c.Add({{"job", "j-1"}, {"rank", "0"}}).Increment(-1);  // ignored
  auto& g = r.AddGauge("shardline_loss", "Loss");
  g.Add({{"job", "a\"b\\c\nd"}}).Set(std::numeric_limits<double>::quiet_NaN());
  g.Add({}).Set(0.1);
  EXPECT_EQ(r.Serialize(),
            "# HELP shardline_tokens_total Tokens processed.\\nSecond line\n"
            "# TYPE shardline_tokens_total counter\n"
            "shardline_tokens_total{job=\"j-1\",rank=\"0\"} 7.5\n"
            "# HELP shardline_loss Loss\n"
            "# TYPE shardline_loss gauge\n"
            "shardline_loss 0.1\n"
            "shardline_loss{job=\"a\\\"b\\\\c\\nd\"} NaN\n");
}

TEST(Metrics, HistogramBucketsAreCumulativeAndInclusive) {
  Registry r;
  auto& h = r.AddHistogram("shardline_step_duration_seconds", "Step time", {0.5, 1, 2});
  Histogram& s = h.Add({{"rank", "1"}});
  for (double v : {0.1, 0.5, 0.75, 2.0, 9.0}) s.Observe(v);
  EXPECT_EQ(r.Serialize(),
            "# HELP shardline_step_duration_seconds Step time\n"
            "# TYPE shardline_step_duration_seconds histogram\n"
            "shardline_step_duration_seconds_bucket{rank=\"1\",le=\"0.5\"} 2\n"
            "shardline_step_duration_seconds_bucket{rank=\"1\",le=\"1\"} 3\n"
            "shardline_step_duration_seconds_bucket{rank=\"1\",le=\"2\"} 4\n"
            "shardline_step_duration_seconds_bucket{rank=\"1\",le=\"+Inf\"} 5\n"
            "shardline_step_duration_seconds_sum{rank=\"1\"} 12.35\n"
            "shardline_step_duration_seconds_count{rank=\"1\"} 5\n");
}

TEST(Metrics, RemoveAndClearDropSeriesAndCollectorsRunFirst) {
  Registry r;
  auto& g = r.AddGauge("shardline_queue_length", "Queued jobs");
  int runs = 0;
  r.AddCollector([&] { g.Add({}).Set(++runs); });
  EXPECT_NE(r.Serialize().find("shardline_queue_length 1\n"), std::string::npos);
  EXPECT_NE(r.Serialize().find("shardline_queue_length 2\n"), std::string::npos);
  g.Add({{"job", "x"}}).Set(3);
  g.Remove({{"job", "x"}});
  EXPECT_EQ(r.Serialize().find("job=\"x\""), std::string::npos);
  auto& c = r.AddCounter("shardline_x_total", "x");
  c.Add({{"a", "1"}}).Increment();
  c.Clear();
  EXPECT_EQ(r.Serialize().find("shardline_x_total{"), std::string::npos);
}

TEST(Metrics, FormatValue) {
  EXPECT_EQ(FormatValue(1e-3), "0.001");
  EXPECT_EQ(FormatValue(123456789012.0), "123456789012");
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(ExponentialBuckets(0.001, 10, 3), (std::vector<double>{0.001, 0.01, 0.1}));
}

std::string HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return "connect failed";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: x\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string resp;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) resp.append(buf, n);
  close(fd);
  return resp;
}

TEST(MetricsServer, ServesMetricsAndJsonOverHttp) {
  Registry r;
  r.AddGauge("shardline_up", "1").Add({}).Set(1);
  auto server = MetricsServer::Start("127.0.0.1:0", &r, {{"/sd/workers", [] { return std::string("[]"); }}});
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);
  std::string m = HttpGet(port, "/metrics");
  EXPECT_NE(m.find("200 OK"), std::string::npos) << m;
  EXPECT_NE(m.find("text/plain; version=0.0.4"), std::string::npos) << m;
  EXPECT_NE(m.find("\r\n\r\n# HELP shardline_up 1\n"), std::string::npos) << m;
  std::string sd = HttpGet(port, "/sd/workers");
  EXPECT_NE(sd.find("application/json"), std::string::npos) << sd;
  EXPECT_EQ(sd.substr(sd.size() - 2), "[]");
  EXPECT_NE(HttpGet(port, "/metricsx").find("404"), std::string::npos);

  // The port is taken now: a second server on it fails with a named address.
  auto clash = MetricsServer::Start("127.0.0.1:" + std::to_string(port), &r);
  ASSERT_FALSE(clash.ok());
  EXPECT_NE(clash.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos);
}

}  // namespace
}  // namespace shardline::metrics
