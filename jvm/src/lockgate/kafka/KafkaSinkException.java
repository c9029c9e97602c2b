package lockgate.kafka;

/** A write of the exactly-once Kafka sink that failed (lockgate's SinkError on the driver). */
public final class KafkaSinkException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  public KafkaSinkException(String message, Throwable cause) {
    super(message, cause);
  }
}
