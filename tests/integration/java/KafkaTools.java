// Runs several of Kafka's own command-line tools in one JVM, for the integration tests (Java's
// source launcher: java -cp "<kafka libs>/*" KafkaTools.java < lines). Each stdin line is a tool's
// main class and its arguments, TAB-separated, e.g.
// "org.apache.kafka.tools.AclCommand<TAB>--bootstrap-server<TAB>127.0.0.1:9092<TAB>--add ...".
// Before each tool it prints "== <line number>" so that its output can be told apart.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;

public class KafkaTools {
    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        int n = 0;
        while ((line = in.readLine()) != null) {
            if (line.isEmpty()) continue;
            String[] f = line.split("\t");
            System.out.println("== " + (++n));
            System.out.flush();
            Class.forName(f[0]).getMethod("main", String[].class)
                .invoke(null, (Object) Arrays.copyOfRange(f, 1, f.length));
            System.out.flush();
        }
    }
}
