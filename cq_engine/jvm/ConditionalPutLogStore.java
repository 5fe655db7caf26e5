package io.cqengine;

import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.util.Iterator;

import io.delta.storage.HadoopFileSystemLogStore;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

/**
 * A Delta log store for S3 that commits a version with one conditional PUT ({@code If-None-Match: *}),
 * the primitive delta-rs commits with on S3. Every writer of a table, Spark's executors' commits and the
 * engine's delta-rs commits alike, then claims version N by creating {@code _delta_log/N.json} only if no
 * one else has: the store decides, so writers in several processes and JVMs never overwrite each other's
 * commit. Delta's own S3SingleDriverLogStore checks for the file and then writes it (two requests), which
 * is safe only when one JVM writes the table (ARCHITECTURE.md, Commits on an object store).
 */
public class ConditionalPutLogStore extends HadoopFileSystemLogStore {
    // Hadoop's create-file option for a PUT with If-None-Match: * (hadoop-aws 3.4.2 and later).
    static final String CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite";

    public ConditionalPutLogStore(Configuration initHadoopConf) {
        super(initHadoopConf);
    }

    @Override
    public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
            throws IOException {
        FileSystem fs = path.getFileSystem(hadoopConf);
        if (overwrite) { // _last_checkpoint and other files Delta rewrites in place
            try (FSDataOutputStream out = fs.create(path, true)) {
                writeLines(out, actions);
            }
            return;
        }
        try {
            FSDataOutputStream out =
                    (FSDataOutputStream) fs.createFile(path).overwrite(false).must(CONDITIONAL_CREATE, true).build();
            try {
                writeLines(out, actions);
            } finally {
                out.close(); // the PUT, conditional: fails when another writer created the version first
            }
        } catch (org.apache.hadoop.fs.FileAlreadyExistsException e) {
            throw new java.nio.file.FileAlreadyExistsException(path.toString());
        } catch (IOException e) {
            if (isPreconditionFailure(e)) {
                // Delta's signal for "this version is taken": it re-reads the log and retries at the next one.
                throw new java.nio.file.FileAlreadyExistsException(path.toString());
            }
            throw e;
        }
    }

    static boolean isPreconditionFailure(Throwable e) {
        for (Throwable t = e; t != null; t = t.getCause()) {
            String text = String.valueOf(t.getMessage());
            if (text.contains("412") || text.contains("PreconditionFailed") || text.contains("Precondition Failed")
                    || text.contains("ConditionalRequestConflict")) {
                return true;
            }
        }
        return false;
    }

    private static void writeLines(OutputStream out, Iterator<String> actions) throws IOException {
        while (actions.hasNext()) {
            out.write((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
        }
    }

    @Override
    public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
        return false; // a PUT is visible whole or not at all
    }
}
