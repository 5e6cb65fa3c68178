import java.io.PrintStream;
import java.time.Duration;
import java.util.List;
import java.util.Properties;

import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * A member of a share group (Apache Kafka's KafkaShareConsumer). Prints "R offset value
 * deliveryCount" for every record it gets. Mode "ack" acknowledges each record (ACCEPT) and
 * commits; mode "hold" takes one poll's records and never acknowledges them, staying alive,
 * so their acquisition lock must time out for anyone else to get them. Runs for maxSeconds.
 */
public class ShareWorker {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], group = args[2], mode = args[3];
        long until = System.currentTimeMillis() + Long.parseLong(args[4]) * 1000L;
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        props.put("group.id", group);
        props.put("share.acknowledgement.mode", "explicit");
        props.put("max.poll.records", "20");
        PrintStream out = System.out;
        try (KafkaShareConsumer<String, String> consumer =
                 new KafkaShareConsumer<>(props, new StringDeserializer(), new StringDeserializer())) {
            consumer.subscribe(List.of(topic));
            out.println("STARTED");
            out.flush();
            boolean holding = false;
            while (System.currentTimeMillis() < until) {
                if (holding) {
                    Thread.sleep(200);
                    continue;
                }
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(500));
                for (ConsumerRecord<String, String> r : records) {
                    out.println("R " + r.offset() + " " + r.value() + " " + r.deliveryCount().orElse((short) -1));
                    if (mode.equals("ack")) {
                        consumer.acknowledge(r, AcknowledgeType.ACCEPT);
                    }
                }
                out.flush();
                if (mode.equals("ack")) {
                    consumer.commitSync();
                } else if (!records.isEmpty()) {
                    holding = true;
                }
            }
        }
        out.println("DONE");
        out.flush();
    }
}
