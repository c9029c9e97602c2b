package lockgate.kafka;

import java.io.Serializable;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.function.MapPartitionsFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The exactly-once Kafka sink's writer in the JVM: the protocol of lockgate's Python writer
 * ({@code lockgate/sinks/kafka.py}, {@code PartitionWriter.write_exactly_once}), with the same
 * transactional ids and markers, so a query may restart on either writer and stay exactly once.
 *
 * <p>Partition {@code p} of batch {@code N} is written by a transactional producer with
 * {@code transactional.id} {@code <prefix>-<p>}. Its marker is the committed offset of the
 * consumer group {@code <prefix>-<p>} on partition 0 of the marker topic, set to {@code N + 1}
 * with {@code sendOffsetsToTransaction} in the transaction of the partition's rows: a batch
 * whose marker is past it was written before and is skipped.
 *
 * <p>Producers are kept per JVM between batches (one user at a time), keyed by transactional
 * id and configuration. A kept producer skips {@code initTransactions}, and the marker read when
 * it committed an earlier batch of the partition last (another producer of the id would have
 * fenced it); whatever fails on it closes it (aborting its transaction) and the partition is
 * written again by a new producer, whose {@code initTransactions} completes or aborts what the
 * old one left open before the marker is read.
 *
 * <p>Made once per query run by the driver ({@code KafkaSink}); {@link #write} runs one batch
 * as a Dataset action (so the batch plan's observations are delivered) and returns the
 * per-partition summary as {@code "partition:rows:written"} items joined by commas.
 */
public final class TransactionalWriter implements Serializable {
  private static final long serialVersionUID = 1L;
  private static final Logger LOG = LoggerFactory.getLogger(TransactionalWriter.class);

  /** Seconds a blocking call on a new producer may take (the Python writer's TIMEOUT_S). */
  static final long TIMEOUT_MS = 60_000L;
  /** Seconds a blocking call on a kept producer may take before it is given up and the
   * partition written again with a new one (the Python writer's KEPT_TIMEOUT_S). */
  static final long KEPT_TIMEOUT_MS = 10_000L;
  /** How long closing a given-up producer may take (its open transaction is aborted by the
   * next producer of its id anyway). */
  static final Duration CLOSE_TIMEOUT = Duration.ofSeconds(5);

  static final String NULL_TOPIC =
      "[KAFKA_NULL_TOPIC_IN_DATA] The Kafka message data sent to the producer contains a null "
          + "topic. Use the `topic` option for setting a default topic.";

  private static final ConcurrentHashMap<String, Kept> KEPT = new ConcurrentHashMap<>();
  private static final AtomicLong PRODUCERS_MADE = new AtomicLong();
  private static final AtomicLong PARTITIONS_WRITTEN = new AtomicLong();

  private final TreeMap<String, String> config;
  private final String topic;
  private final String idPrefix;
  private final String markerTopic;
  private final int topicIndex;
  private final int keyIndex;
  private final int valueIndex;
  private final int partitionIndex;
  private final int headersIndex;

  /**
   * @param config the producer's properties ({@code kafka.*} options without the prefix)
   * @param topic the {@code topic} option, or null: each row's {@code topic} column
   * @param idPrefix the transactional ids' prefix
   * @param markerTopic the marker topic
   * @param topicIndex where the {@code topic} column is in the input, -1 for none; likewise
   *     the others ({@code value} is required)
   */
  public TransactionalWriter(
      Map<String, String> config,
      String topic,
      String idPrefix,
      String markerTopic,
      int topicIndex,
      int keyIndex,
      int valueIndex,
      int partitionIndex,
      int headersIndex) {
    this.config = new TreeMap<>(config);
    this.topic = topic;
    this.idPrefix = idPrefix;
    this.markerTopic = markerTopic;
    this.topicIndex = topicIndex;
    this.keyIndex = keyIndex;
    this.valueIndex = valueIndex;
    this.partitionIndex = partitionIndex;
    this.headersIndex = headersIndex;
  }

  /** Transactional producers made in this JVM (each one an {@code initTransactions}). */
  public static long producersMade() {
    return PRODUCERS_MADE.get();
  }

  /** Partitions of batches this JVM's writers committed a transaction for. */
  public static long partitionsWritten() {
    return PARTITIONS_WRITTEN.get();
  }

  private static final StructType SUMMARY =
      new StructType()
          .add("partition", DataTypes.IntegerType, false)
          .add("rows", DataTypes.LongType, false)
          .add("written", DataTypes.BooleanType, false);

  /** Write batch {@code batchId} of {@code data}; the summary of its partitions. */
  public String write(Dataset<Row> data, long batchId) {
    Task task = new Task(this, batchId);
    List<Row> rows = data.mapPartitions(task, Encoders.row(SUMMARY)).collectAsList();
    StringBuilder out = new StringBuilder();
    for (Row row : rows) {
      if (out.length() > 0) {
        out.append(',');
      }
      out.append(row.getInt(0)).append(':').append(row.getLong(1)).append(':')
          .append(row.getBoolean(2) ? 1 : 0);
    }
    return out.toString();
  }

  /** The function of one batch's tasks. */
  static final class Task implements MapPartitionsFunction<Row, Row> {
    private static final long serialVersionUID = 1L;
    private final TransactionalWriter writer;
    private final long batch;

    Task(TransactionalWriter writer, long batch) {
      this.writer = writer;
      this.batch = batch;
    }

    @Override
    public Iterator<Row> call(Iterator<Row> input) throws Exception {
      TaskContext context = TaskContext.get();
      int partition = context != null ? context.partitionId() : 0;
      List<Row> rows = new ArrayList<>();
      input.forEachRemaining(rows::add);
      // A re-run gives this partition no rows either: no producer, no transaction.
      boolean written = !rows.isEmpty() && writer.writePartition(partition, batch, rows);
      return Collections.singletonList(RowFactory.create(partition, (long) rows.size(), written))
          .iterator();
    }
  }

  /** A transactional producer and the consumer that reads its marker. */
  private static final class Kept {
    final KafkaProducer<byte[], byte[]> producer;
    final KafkaConsumer<byte[], byte[]> consumer;
    boolean inTransaction;
    Long lastBatch;

    Kept(KafkaProducer<byte[], byte[]> producer, KafkaConsumer<byte[], byte[]> consumer) {
      this.producer = producer;
      this.consumer = consumer;
    }

    void close() {
      try {
        // A graceful close aborts the open transaction (the producer's sender does).
        producer.close(CLOSE_TIMEOUT);
      } catch (RuntimeException e) {
        LOG.debug("Closing a transactional producer failed", e);
      } finally {
        try {
          consumer.close(Duration.ZERO);
        } catch (RuntimeException e) {
          LOG.debug("Closing a marker consumer failed", e);
        }
      }
    }
  }

  private Kept make(String transactionalId) {
    Properties producerProps = new Properties();
    producerProps.putAll(config);
    producerProps.put("transactional.id", transactionalId);
    producerProps.put("enable.idempotence", "true");
    producerProps.put("key.serializer", ByteArraySerializer.class.getName());
    producerProps.put("value.serializer", ByteArraySerializer.class.getName());
    Properties consumerProps = new Properties();
    for (Map.Entry<String, String> e : config.entrySet()) {
      String k = e.getKey();
      if (k.equals("bootstrap.servers") || k.startsWith("security.") || k.startsWith("ssl.")
          || k.startsWith("sasl.")) {
        consumerProps.put(k, e.getValue());
      }
    }
    consumerProps.put("group.id", transactionalId);
    consumerProps.put("enable.auto.commit", "false");
    consumerProps.put("isolation.level", "read_committed");
    consumerProps.put("key.deserializer", ByteArrayDeserializer.class.getName());
    consumerProps.put("value.deserializer", ByteArrayDeserializer.class.getName());
    KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(producerProps);
    KafkaConsumer<byte[], byte[]> consumer;
    try {
      consumer = new KafkaConsumer<>(consumerProps);
    } catch (RuntimeException e) {
      producer.close(Duration.ZERO);
      throw e;
    }
    Kept kept = new Kept(producer, consumer);
    PRODUCERS_MADE.incrementAndGet();
    try {
      // Fences earlier producers of this id and completes their open transaction.
      producer.initTransactions();
    } catch (RuntimeException e) {
      kept.close();
      throw e;
    }
    return kept;
  }

  private String keyOf(String transactionalId) {
    return transactionalId + '\u0000' + config;
  }

  boolean writePartition(int partition, long batch, List<Row> rows) throws Exception {
    String transactionalId = idPrefix + "-" + partition;
    String key = keyOf(transactionalId);
    Kept kept = KEPT.remove(key);
    if (kept != null) {
      Boolean written = withKept(kept, transactionalId, partition, batch, rows);
      if (written != null) {
        giveBack(key, kept);
        return written;
      }
    }
    Kept fresh = make(transactionalId);
    boolean written;
    try {
      written = transact(fresh, partition, batch, rows, TIMEOUT_MS);
    } catch (Exception e) {
      fresh.close();
      throw e;
    }
    giveBack(key, fresh);
    return written;
  }

  /** The partition written with a kept producer, or null when that failed (the producer
   * is then closed, and the partition is to be written again with a new one). */
  private Boolean withKept(
      Kept kept, String transactionalId, int partition, long batch, List<Row> rows) {
    try {
      return transact(kept, partition, batch, rows, KEPT_TIMEOUT_MS);
    } catch (Exception e) {
      LOG.warn(
          "Kafka sink: the kept transactional producer {} failed in batch {} ({}); aborting "
              + "and writing the partition again with a new producer",
          transactionalId, batch, e.toString());
      kept.close();
      return null;
    }
  }

  private static void giveBack(String key, Kept client) {
    Kept previous = KEPT.put(key, client);
    if (previous != null) { // another task of the id gave one back meanwhile
      previous.close();
    }
  }

  private boolean transact(Kept client, int partition, long batch, List<Row> rows, long timeoutMs)
      throws Exception {
    TopicPartition marker = new TopicPartition(markerTopic, 0);
    if (client.lastBatch == null || client.lastBatch >= batch) {
      Map<TopicPartition, OffsetAndMetadata> committed =
          client.consumer.committed(Set.of(marker), Duration.ofMillis(timeoutMs));
      OffsetAndMetadata offset = committed.get(marker);
      if (offset != null && offset.offset() > batch) {
        LOG.info(
            "Kafka sink: partition {} of batch {} was written before; skipped", partition, batch);
        return false;
      }
    }
    // Else this producer committed an earlier batch of the partition last: had another
    // producer of the id been initialised since, this one is fenced, its transaction fails,
    // and the partition is written again by a new producer, which reads the marker.
    KafkaProducer<byte[], byte[]> producer = client.producer;
    producer.beginTransaction();
    client.inTransaction = true;
    List<Future<RecordMetadata>> sent = new ArrayList<>(rows.size());
    for (Row row : rows) {
      sent.add(producer.send(record(row)));
    }
    // The marker joins the transaction while the rows are on their way; nothing is visible
    // before the commit, which comes only after every row is acknowledged.
    producer.sendOffsetsToTransaction(
        Map.of(marker, new OffsetAndMetadata(batch + 1)),
        new ConsumerGroupMetadata(idPrefix + "-" + partition));
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMs);
    for (Future<RecordMetadata> future : sent) {
      long left = Math.max(0L, deadline - System.nanoTime());
      try {
        future.get(left, TimeUnit.NANOSECONDS);
      } catch (ExecutionException e) {
        throw new KafkaSinkException(
            "Batch " + batch + ", partition " + partition + ": Kafka refused a record: "
                + e.getCause() + "; the transaction was aborted.", e.getCause());
      } catch (java.util.concurrent.TimeoutException e) {
        throw new KafkaSinkException(
            "Batch " + batch + ", partition " + partition + ": records not acknowledged in "
                + (timeoutMs / 1000) + " s; the transaction was aborted.", e);
      }
    }
    producer.commitTransaction();
    client.inTransaction = false;
    client.lastBatch = batch;
    PARTITIONS_WRITTEN.incrementAndGet();
    return true;
  }

  private ProducerRecord<byte[], byte[]> record(Row row) {
    String target = topic;
    if (target == null) {
      target = row.isNullAt(topicIndex) ? null : row.getString(topicIndex);
      if (target == null) {
        throw new KafkaSinkException(NULL_TOPIC, null);
      }
    }
    byte[] key = keyIndex < 0 ? null : bytes(row.get(keyIndex));
    byte[] value = bytes(row.get(valueIndex));
    Integer partition =
        partitionIndex < 0 || row.isNullAt(partitionIndex) ? null : row.getInt(partitionIndex);
    List<Header> headers = null;
    if (headersIndex >= 0 && !row.isNullAt(headersIndex)) {
      List<Row> given = row.getList(headersIndex);
      headers = new ArrayList<>(given.size());
      for (Row header : given) {
        headers.add(
            new RecordHeader(
                header.isNullAt(0) ? null : header.getString(0),
                header.isNullAt(1) ? null : (byte[]) header.get(1)));
      }
    }
    return new ProducerRecord<>(target, partition, key, value, headers);
  }

  /** A string's UTF-8 bytes (Spark's cast to binary), or the binary as it is. */
  private static byte[] bytes(Object value) {
    if (value == null) {
      return null;
    }
    if (value instanceof byte[]) {
      return (byte[]) value;
    }
    return value.toString().getBytes(java.nio.charset.StandardCharsets.UTF_8);
  }
}
