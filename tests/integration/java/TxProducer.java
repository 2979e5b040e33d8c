// A transactional Java producer for the integration tests (run by Java's source launcher:
// java -cp "<kafka libs>/*" TxProducer.java BOOTSTRAP TOPIC PARTITION < script).
// Script lines: "begin", "send<TAB>key<TAB>value", "commit", "abort".
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Properties;
import java.util.UUID;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringSerializer;

public class TxProducer {
    public static void main(String[] args) throws Exception {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, "tailguard-test-" + UUID.randomUUID());
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        String topic = args[1];
        int partition = Integer.parseInt(args[2]);
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
            producer.initTransactions();
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
            String line;
            while ((line = in.readLine()) != null) {
                if (line.isEmpty()) continue;
                String[] f = line.split("\t", 3);
                switch (f[0]) {
                    case "begin" -> producer.beginTransaction();
                    case "send" -> producer.send(new ProducerRecord<>(topic, partition, f[1], f[2]));
                    case "commit" -> producer.commitTransaction();
                    case "abort" -> { producer.flush(); producer.abortTransaction(); }
                    default -> throw new IllegalArgumentException("unknown command: " + f[0]);
                }
            }
        }
    }
}
