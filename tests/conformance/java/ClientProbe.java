// Kafka's Java client (kafka-clients) driven by JSON lines on stdin, for the differential
// conformance suite (tests/conformance/test_differential.py). One JSON object per line in, one per
// line out: {"op": ..., "bootstrap": ..., ...} -> {"ok": ...} or {"error": "<Kafka error name>"}.
// A test tool only: compiled at test time into a temporary directory against the kafka-clients jar
// scripts/peers.sh fetched; nothing of it is part of Sluice.
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.*;
import java.util.concurrent.ExecutionException;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.*;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.protocol.Errors;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class ClientProbe {
  static final ObjectMapper JSON = new ObjectMapper();
  static final Map<String, KafkaConsumer<byte[], byte[]>> members = new HashMap<>();

  public static void main(String[] args) throws Exception {
    PrintStream out = new PrintStream(System.out, true, "UTF-8");
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    out.println("{\"ready\": true}");
    for (String line; (line = in.readLine()) != null; ) {
      if (line.isBlank()) continue;
      Map<String, Object> reply = new LinkedHashMap<>();
      try {
        @SuppressWarnings("unchecked")
        Map<String, Object> cmd = JSON.readValue(line, Map.class);
        reply.put("ok", run(cmd));
      } catch (Throwable e) {
        Throwable c = (e instanceof ExecutionException && e.getCause() != null) ? e.getCause() : e;
        reply.put("error", errorName(c));
        reply.put("detail", c.getClass().getName() + ": " + c.getMessage());
      }
      out.println(JSON.writeValueAsString(reply));
    }
    for (KafkaConsumer<byte[], byte[]> c : members.values()) c.close(Duration.ofSeconds(5));
  }

  /** Kafka's name for the error a client exception stands for (UNKNOWN_SERVER_ERROR if none). */
  static String errorName(Throwable c) {
    Errors e = Errors.forException(c);
    if (e != Errors.UNKNOWN_SERVER_ERROR) return e.name();
    // a client-side exception of kafka-clients (OffsetOutOfRangeException...) is the client's
    // answer; any other is this program's own fault, which fails the comparison
    String prefix = c.getClass().getName().startsWith("org.apache.kafka.") ? "CLIENT:" : "DRIVER:";
    return prefix + c.getClass().getSimpleName();
  }

  static Properties props(Map<String, Object> cmd) {
    Properties p = new Properties();
    p.put("bootstrap.servers", cmd.get("bootstrap"));
    @SuppressWarnings("unchecked")
    Map<String, Object> extra = (Map<String, Object>) cmd.getOrDefault("config", Map.of());
    for (Map.Entry<String, Object> e : extra.entrySet()) p.put(e.getKey(), String.valueOf(e.getValue()));
    return p;
  }

  static Admin admin(Map<String, Object> cmd) {
    Properties p = props(cmd);
    p.put("request.timeout.ms", "15000");
    p.put("default.api.timeout.ms", "20000");
    return Admin.create(p);
  }

  static byte[] bytes(Object o) {
    return o == null ? null : ((String) o).getBytes(StandardCharsets.UTF_8);
  }

  static String str(byte[] b) {
    return b == null ? null : new String(b, StandardCharsets.UTF_8);
  }

  static int num(Map<String, Object> cmd, String key) {
    return ((Number) cmd.get(key)).intValue();
  }

  static KafkaConsumer<byte[], byte[]> consumer(Map<String, Object> cmd, String group, String reset) {
    Properties p = props(cmd);
    if (group != null) p.put("group.id", group);
    p.put("enable.auto.commit", "false");
    p.put("auto.offset.reset", reset);
    p.put("allow.auto.create.topics", "false");
    // a commit the broker keeps refusing with a retriable error gives up after this long
    p.put("default.api.timeout.ms", "2000");
    p.put("session.timeout.ms", "45000"); // drivers.py SESSION_TIMEOUT_MS
    p.put("heartbeat.interval.ms", "500");
    return new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer());
  }

  @SuppressWarnings("unchecked")
  static Object run(Map<String, Object> cmd) throws Exception {
    String op = (String) cmd.get("op");
    String topic = (String) cmd.get("topic");
    switch (op) {
      case "create_topic":
        try (Admin a = admin(cmd)) {
          NewTopic t = new NewTopic(topic, num(cmd, "partitions"), (short) num(cmd, "replication_factor"));
          t.configs((Map<String, String>) cmd.getOrDefault("configs", Map.of()));
          a.createTopics(List.of(t)).all().get();
          return "NONE";
        }
      case "delete_topic":
        try (Admin a = admin(cmd)) {
          a.deleteTopics(List.of(topic)).all().get();
          return "NONE";
        }
      case "create_partitions":
        try (Admin a = admin(cmd)) {
          a.createPartitions(Map.of(topic, NewPartitions.increaseTo(num(cmd, "count")))).all().get();
          return "NONE";
        }
      case "metadata":
        try (Admin a = admin(cmd)) {
          TopicDescription d = a.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
          List<Object> parts = new ArrayList<>();
          for (TopicPartitionInfo p : d.partitions())
            parts.add(Map.of("partition", p.partition(), "replicas", p.replicas().size(), "isr", p.isr().size()));
          return Map.of("internal", d.isInternal(), "partitions", parts);
        }
      case "describe_configs":
        try (Admin a = admin(cmd)) {
          ConfigResource r = new ConfigResource(ConfigResource.Type.TOPIC, topic);
          Config c = a.describeConfigs(List.of(r)).all().get().get(r);
          Map<String, Object> got = new TreeMap<>();
          for (String name : (List<String>) cmd.get("names")) {
            ConfigEntry e = c.get(name);
            got.put(name, e == null ? null : List.of(String.valueOf(e.value()), e.source().name(), e.isReadOnly()));
          }
          return got;
        }
      case "describe_cluster":
        try (Admin a = admin(cmd)) {
          DescribeClusterResult r = a.describeCluster();
          return Map.of(
              "nodes", r.nodes().get().size(),
              "controller", r.controller().get() != null,
              "cluster_id", r.clusterId().get() != null);
        }
      case "produce":
        {
          Properties p = props(cmd);
          p.put("enable.idempotence", String.valueOf(cmd.getOrDefault("idempotent", false)));
          p.put("acks", "all");
          p.put("linger.ms", "5");
          p.put("retries", cmd.getOrDefault("idempotent", false).equals(true) ? "2147483647" : "0");
          p.put("max.request.size", "4194304");
          p.put("delivery.timeout.ms", "30000");
          p.put("request.timeout.ms", "15000");
          try (KafkaProducer<byte[], byte[]> pr =
              new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer())) {
            List<java.util.concurrent.Future<RecordMetadata>> sent = new ArrayList<>();
            for (Map<String, Object> r : (List<Map<String, Object>>) cmd.get("records")) {
              List<Header> headers = new ArrayList<>();
              for (List<Object> h : (List<List<Object>>) r.getOrDefault("headers", List.of()))
                headers.add(new org.apache.kafka.common.header.internals.RecordHeader((String) h.get(0), bytes(h.get(1))));
              Object ts = r.get("timestamp");
              String value = (String) r.get("value");
              Object repeat = r.get("value_repeat");
              if (repeat != null) value = value.repeat(((Number) repeat).intValue());
              sent.add(pr.send(new ProducerRecord<>(topic, num(cmd, "partition"),
                  ts == null ? null : ((Number) ts).longValue(), bytes(r.get("key")), bytes(value), headers)));
            }
            pr.flush();
            List<Object> offsets = new ArrayList<>();
            for (java.util.concurrent.Future<RecordMetadata> f : sent) offsets.add(f.get().offset());
            return offsets;
          }
        }
      case "fetch":
        try (KafkaConsumer<byte[], byte[]> c = consumer(cmd, null, "none")) {
          TopicPartition tp = new TopicPartition(topic, num(cmd, "partition"));
          c.assign(List.of(tp));
          c.seek(tp, ((Number) cmd.get("offset")).longValue());
          int want = num(cmd, "count");
          List<Object> got = new ArrayList<>();
          long deadline = System.currentTimeMillis() + 15000;
          while (got.size() < want && System.currentTimeMillis() < deadline) {
            for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
              List<Object> hs = new ArrayList<>();
              for (Header h : r.headers()) hs.add(Arrays.asList(h.key(), str(h.value())));
              Map<String, Object> m = new LinkedHashMap<>();
              m.put("offset", r.offset());
              m.put("key", str(r.key()));
              m.put("value", str(r.value()));
              m.put("headers", hs);
              m.put("timestamp", r.timestamp());
              m.put("timestamp_type", r.timestampType().name());
              got.add(m);
            }
          }
          return got;
        }
      case "list_offsets":
        try (Admin a = admin(cmd)) {
          TopicPartition tp = new TopicPartition(topic, num(cmd, "partition"));
          String spec = (String) cmd.get("spec");
          OffsetSpec s = spec.equals("earliest") ? OffsetSpec.earliest()
              : spec.equals("latest") ? OffsetSpec.latest()
              : spec.equals("max_timestamp") ? OffsetSpec.maxTimestamp()
              : OffsetSpec.forTimestamp(((Number) cmd.get("timestamp")).longValue());
          ListOffsetsResult.ListOffsetsResultInfo i = a.listOffsets(Map.of(tp, s)).all().get().get(tp);
          return Map.of("offset", i.offset(), "timestamp", i.timestamp());
        }
      case "commit":
        try (KafkaConsumer<byte[], byte[]> c = consumer(cmd, (String) cmd.get("group"), "none")) {
          TopicPartition tp = new TopicPartition(topic, num(cmd, "partition"));
          c.commitSync(Map.of(tp, new OffsetAndMetadata(((Number) cmd.get("offset")).longValue(), (String) cmd.get("metadata"))));
          return "NONE";
        }
      case "committed":
        try (Admin a = admin(cmd)) {
          Map<TopicPartition, OffsetAndMetadata> m =
              a.listConsumerGroupOffsets((String) cmd.get("group")).partitionsToOffsetAndMetadata().get();
          Map<String, Object> got = new TreeMap<>();
          for (Map.Entry<TopicPartition, OffsetAndMetadata> e : m.entrySet())
            got.put(e.getKey().toString(), e.getValue() == null ? null : List.of(e.getValue().offset(), e.getValue().metadata()));
          return got;
        }
      case "join":
        {
          KafkaConsumer<byte[], byte[]> c = consumer(cmd, (String) cmd.get("group"), "earliest");
          c.subscribe(List.of(topic));
          members.put((String) cmd.get("member"), c);
          return "NONE";
        }
      case "poll_members":
        {
          // Poll every member in turn until their assignments cover `partitions` partitions, each
          // once, with every member holding some while there are enough to go round, and stay so
          // for a few rounds; answers each member's sorted assignment. (A member that joined but
          // whose rebalance still runs holds nothing: without that check it looked settled.)
          int want = num(cmd, "partitions");
          long deadline = System.currentTimeMillis() + 30000;
          int stable = 0;
          Map<String, Object> last = null;
          while (System.currentTimeMillis() < deadline) {
            Map<String, Object> now = new TreeMap<>();
            int total = 0;
            int holding = 0;
            Set<Integer> seen = new HashSet<>();
            for (Map.Entry<String, KafkaConsumer<byte[], byte[]>> e : members.entrySet()) {
              e.getValue().poll(Duration.ofMillis(100));
              List<Integer> ps = new ArrayList<>();
              for (TopicPartition tp : e.getValue().assignment()) ps.add(tp.partition());
              Collections.sort(ps);
              total += ps.size();
              if (!ps.isEmpty()) holding++;
              seen.addAll(ps);
              now.put(e.getKey(), ps);
            }
            boolean spread = holding == Math.min(want, members.size());
            stable = (total == want && seen.size() == want && spread && now.equals(last)) ? stable + 1 : 0;
            last = now;
            if (stable >= 5) return now;
          }
          throw new IllegalStateException("members never settled: " + last);
        }
      case "leave":
        members.remove((String) cmd.get("member")).close(Duration.ofSeconds(10));
        return "NONE";
      case "describe_group":
        try (Admin a = admin(cmd)) {
          String g = (String) cmd.get("group");
          ConsumerGroupDescription d = a.describeConsumerGroups(List.of(g)).all().get().get(g);
          List<Object> assignments = new ArrayList<>();
          for (MemberDescription m : d.members()) {
            List<Integer> ps = new ArrayList<>();
            for (TopicPartition tp : m.assignment().topicPartitions()) ps.add(tp.partition());
            Collections.sort(ps);
            assignments.add(ps);
          }
          assignments.sort(Comparator.comparing(Object::toString));
          return Map.of("state", d.state().name(), "protocol", d.partitionAssignor(), "assignments", assignments);
        }
      default:
        throw new IllegalArgumentException("unknown op " + op);
    }
  }
}
