# Sourced by scripts/kafka.sh and scripts/elasticmq.sh: a JVM server's jars from Maven Central, once.
#
#   maven_jars DIR GROUP:ARTIFACT:VERSION...   the artifacts and their runtime dependencies into DIR/libs
#                                              (nothing to do when DIR/libs/.complete exists)

maven_jars() {
  local dir="$1" deps="" coord g a v
  shift
  [ -f "$dir/libs/.complete" ] && return 0
  command -v mvn >/dev/null || { echo "Maven (mvn) is needed to fetch the jars: apt-get install maven" >&2; return 1; }
  command -v java >/dev/null || { echo "a Java runtime (17+) is needed: apt-get install openjdk-17-jre-headless" >&2; return 1; }
  for coord in "$@"; do
    IFS=: read -r g a v <<<"$coord"
    deps="$deps<dependency><groupId>$g</groupId><artifactId>$a</artifactId><version>$v</version></dependency>"
  done
  mkdir -p "$dir"
  # A pom naming only what is wanted: Maven resolves the runtime dependencies from Maven Central.
  cat >"$dir/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>
  <groupId>dev.idem.ci</groupId><artifactId>runtime</artifactId><version>1</version><packaging>pom</packaging>
  <dependencies>$deps</dependencies>
</project>
POM
  rm -rf "$dir/libs"
  mvn -B -q -f "$dir/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
    -DoutputDirectory="$dir/libs" >"$dir/fetch.log" 2>&1 || { cat "$dir/fetch.log" >&2; return 1; }
  touch "$dir/libs/.complete"
}
