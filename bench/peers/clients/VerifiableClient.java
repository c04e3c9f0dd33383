// Kafka's Java client (kafka-clients) as a verifiable producer and a group consumer for
// `sluice chaos run --java-client` (issue 20), beside librdkafka's. A test tool: compiled at run
// time with javac against the kafka-clients jar scripts/peers.sh fetched; nothing of it is part
// of Sluice.
//
// Arguments: bootstrap topic partitions writer group rate_per_s
// The producer writes "{writer}:{partition}:{seq}" round robin over the partitions (idempotent,
// acks=all), the consumer reads the topic in `group`, committing after each poll. Output, one
// JSON array a line: ["ack", partition, offset, value], ["error", name], ["read", partition,
// offset, value], and ["done", sent] once stdin closes and the producer has flushed.
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.protocol.Errors;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class VerifiableClient {
  static PrintStream out;

  static synchronized void emit(String line) {
    out.println(line);
  }

  static String errorName(Exception e) {
    Errors err = Errors.forException(e);
    return err == Errors.UNKNOWN_SERVER_ERROR ? e.getClass().getSimpleName() : err.name();
  }

  public static void main(String[] args) throws Exception {
    out = new PrintStream(System.out, true, "UTF-8");
    String bootstrap = args[0], topic = args[1], writer = args[3], group = args[4];
    int partitions = Integer.parseInt(args[2]);
    double rate = Double.parseDouble(args[5]);
    AtomicBoolean stop = new AtomicBoolean(false);

    Thread reader = new Thread(() -> consume(bootstrap, topic, group, stop), "verifiable-java-reader");
    reader.start();

    Properties p = new Properties();
    p.put("bootstrap.servers", bootstrap);
    p.put("acks", "all");
    p.put("enable.idempotence", "true");
    p.put("linger.ms", "2");
    p.put("delivery.timeout.ms", "60000");
    p.put("retry.backoff.ms", "100");
    p.put("metadata.max.age.ms", "1000");
    long sent = 0;
    try (KafkaProducer<byte[], byte[]> producer =
        new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer())) {
      Thread stdin = new Thread(() -> {
        try {
          while (System.in.read() >= 0) {}
        } catch (Exception ignored) {
        }
        stop.set(true);
      }, "verifiable-java-stdin");
      stdin.setDaemon(true);
      stdin.start();
      long[] seq = new long[partitions];
      long started = System.nanoTime();
      while (!stop.get()) {
        int partition = (int) (sent % partitions);
        String value = writer + ":" + partition + ":" + seq[partition]++;
        producer.send(
            new ProducerRecord<>(topic, partition, null, value.getBytes(StandardCharsets.UTF_8)),
            (md, e) -> {
              if (e == null) emit("[\"ack\"," + md.partition() + "," + md.offset() + ",\"" + value + "\"]");
              else emit("[\"error\",\"" + errorName(e) + "\"]");
            });
        sent++;
        long due = started + (long) (sent * 1e9 / rate);
        long wait = due - System.nanoTime();
        if (wait > 0) Thread.sleep(wait / 1_000_000, (int) (wait % 1_000_000));
      }
      producer.flush();
    }
    reader.join(30_000);
    emit("[\"done\"," + sent + "]");
  }

  static void consume(String bootstrap, String topic, String group, AtomicBoolean stop) {
    Properties p = new Properties();
    p.put("bootstrap.servers", bootstrap);
    p.put("group.id", group);
    p.put("enable.auto.commit", "false");
    p.put("auto.offset.reset", "earliest");
    p.put("session.timeout.ms", "6000");
    p.put("heartbeat.interval.ms", "500");
    try (KafkaConsumer<byte[], byte[]> c =
        new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
      c.subscribe(List.of(topic));
      while (!stop.get()) {
        try {
          for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
            String value = new String(r.value(), StandardCharsets.UTF_8);
            emit("[\"read\"," + r.partition() + "," + r.offset() + ",\"" + value + "\"]");
          }
          c.commitSync(Duration.ofSeconds(10));
        } catch (Exception e) {
          emit("[\"error\",\"read:" + errorName(e) + "\"]");
        }
      }
    }
  }
}
